// Sandlot's Node.js wrapper: runs inside the jail, as the first and only script of a
// node process that serves exactly one run.
//
// Everything it does happens before user code exists: it warms what every run
// needs, reads the run request from fd 0 (a 4-byte little-endian length, then
// JSON), and hands the code to V8 as a sloppy-mode script in this context.
// After that it only hastens the exit (exitNow) with what it took before user code
// existed, so whatever user code redefines (parseInt, JSON, Buffer, console,
// process.exit, require, Function.prototype) changes nothing it relies on. Exit status
// comes from the kernel, or from exitNow's report, which can only end this run.
// The seccomp filter was loaded before node started; it admits no process
// creation, and no network calls unless the run has network.
//
// Where runs have PID namespaces, node is pid 1 of its own, and the kernel spares a pid 1
// every signal it sends itself while that signal's action is the default (SIGKILL
// included): process.kill and process.abort are wrapped (signalShim) so that such a signal
// still ends the run as it ends any other process, reported on fd 3 as killed by it.
// Aborts inside node itself (a fatal V8 error) end it with SIGSEGV instead of SIGABRT.
//
// It also serves as the entry of a V8 startup snapshot (node --build-snapshot):
// the warm-up is then paid once when the snapshot is built, not by every run.
'use strict';

const fs = require('fs');
const os = require('os');
const util = require('util');
const v8 = require('v8');
const vm = require('vm');
const { createRequire } = require('module');
const { Writable } = require('stream');

const PRIVATE_SNAPSHOT = '.sandlot-snapshot'; // in the run's TMPDIR: see runner.py
const SNAPSHOT_BY_FD = '/proc/self/fd/4'; // the snapshot's memfd where there is no tree: see runner.py (SNAPSHOT_FD)

function readExact(size) {
  const buffer = Buffer.allocUnsafe(size);
  let offset = 0;
  while (offset < size) {
    const count = fs.readSync(0, buffer, offset, size - offset, null);
    if (count === 0) throw new Error('sandbox: the run request was cut short');
    offset += count;
  }
  return buffer;
}

// What every run goes through: the request's JSON, the script compiler, require(), and
// console.log's formatting and write path (pointed at a stream that writes nowhere).
function warm() {
  JSON.parse('{"code": "console.log(1)"}');
  util.format('%s %d %o', 'warm', 1, { warm: [1] });
  new vm.Script('void 0', { filename: 'warm.js' }).runInThisContext();
  createRequire('/tmp/main.js');
  const nowhere = new Writable({ write(chunk, encoding, done) { done(); } });
  const stdout = console._stdout;
  console._stdout = nowhere;
  console.log('%s %o', 'warm', { warm: [1] });
  console._stdout = stdout;
  // and what main() runs before the code, so that a run compiles none of it again: the request read from a
  // descriptor (here one that holds nothing), its JSON, an 'exit' listener
  readExact(0);
  try {
    const fd = fs.openSync('/dev/null', 'r');
    fs.readSync(fd, Buffer.allocUnsafe(4), 0, 4, null);
    fs.closeSync(fd);
  } catch {
    // no /dev/null here: a run compiles fs.readSync itself
  }
  JSON.parse(Buffer.from('{"code": ""}').toString('utf8'));
  const listener = () => {};
  process.on('exit', listener);
  process.removeListener('exit', listener);
}

// args: what follows the script (or the snapshot) on node's command line: [layer node_modules]
function main(args) {
  // Started from a snapshot copied into this run's /tmp (runner.py): it holds the hash
  // seed of every run of this zygote, so it goes before anything else can read it.
  const snapshotAt = process.execArgv.indexOf('--snapshot-blob');
  const privateSnapshot = `${process.env.TMPDIR || '/tmp'}/${PRIVATE_SNAPSHOT}`; // this run's, read at run time
  if (snapshotAt >= 0 && process.execArgv[snapshotAt + 1] === privateSnapshot) fs.unlinkSync(privateSnapshot);
  // or from the zygote's sealed copy, inherited as this descriptor (runner.py, SNAPSHOT_FD): closed the same way
  if (snapshotAt >= 0 && process.execArgv[snapshotAt + 1] === SNAPSHOT_BY_FD) fs.closeSync(Number(SNAPSHOT_BY_FD.slice(14)));
  // Output pipes block when full (node queues in memory otherwise): a flood meets the
  // output cap, not the heap limit, and process.exit() loses nothing.
  for (const stream of [process.stdout, process.stderr]) {
    if (stream._handle && typeof stream._handle.setBlocking === 'function') stream._handle.setBlocking(true);
  }
  process.stdout.write('');

  // require() as a script in /tmp would have it, plus the dependency layer's packages
  const layer = args[0];
  globalThis.require = createRequire(layer ? `${layer}/../main.js` : '/tmp/main.js');
  globalThis.module = { exports: {} };
  globalThis.exports = globalThis.module.exports;
  globalThis.__filename = '/tmp/main.js';
  globalThis.__dirname = '/tmp';
  process.argv = [process.argv[0], '/tmp/main.js'];
  if (process.pid === 1) signalShim();

  const size = readExact(4).readUInt32LE(0);
  const request = JSON.parse(readExact(size).toString('utf8'));
  if (typeof request.network_refused === 'string' && request.network_refused) refuseNetwork(request.network_refused);
  if (typeof request.tmp_note === 'string' && request.tmp_note) noteTmpElsewhere(request.tmp_note);
  learnOwnFile();
  Error.prepareStackTrace = userStack;
  const script = new vm.Script(request.code, { filename: 'main.js' });
  script.runInThisContext();
  process.on('uncaughtExceptionMonitor', () => { crashing = true; });
  process.on('exit', exitNow);
}

// A run that asked for network where it gets none (runtimes/jail/policy/network_access.py): its connections,
// datagrams and name lookups fail with an EPERM error saying why, as a refused connection would fail
// (an 'error' event, a rejected promise, a callback's error), instead of the filter's bare EPERM. Only
// the message: the filter loaded for a run without network is what refuses them.
function refuseNetwork(message) {
  const net = require('net');
  const dgram = require('dgram');
  const dns = require('dns');
  const refusal = (syscall) => {
    const error = new Error(`${syscall} EPERM: ${message}`);
    error.code = 'EPERM';
    error.errno = -1; // -EPERM
    error.syscall = syscall;
    return error;
  };
  net.Socket.prototype.connect = function connect() {
    const socket = this;
    process.nextTick(() => socket.destroy(refusal('connect')));
    return socket;
  };
  for (const name of ['send', 'connect', 'bind']) {
    dgram.Socket.prototype[name] = function refused() {
      const callback = [...arguments].reverse().find((arg) => typeof arg === 'function');
      const error = refusal(name);
      if (callback) process.nextTick(callback, error);
      else process.nextTick(() => this.emit('error', error));
      return this;
    };
  }
  const lookup = (...args) => {
    const callback = args.reverse().find((arg) => typeof arg === 'function');
    if (callback) process.nextTick(callback, refusal('getaddrinfo'));
    return {};
  };
  dns.lookup = lookup;
  dns.resolve = lookup;
  dns.promises.lookup = async () => { throw refusal('getaddrinfo'); };
  dns.promises.resolve = dns.promises.lookup;
}

// Stack traces as node prints them, cut where the user's script was entered (node:vm): the
// frames below (this wrapper, node's loader) would show the service's own paths. The
// wrapper's file name is learnt as the run starts (in a snapshot it is the one it was built from).
let ownFile = null;
const { toString: errorToString } = Error.prototype;
const { join } = Array.prototype;

function learnOwnFile() {
  Error.prepareStackTrace = (error, trace) => trace;
  const trace = new Error().stack;
  Error.prepareStackTrace = undefined;
  ownFile = Array.isArray(trace) && trace.length ? trace[0].getFileName() : null;
}

function userStack(error, trace) {
  let end = 0;
  while (end < trace.length && trace[end].getFileName() !== ownFile) end++;
  let text;
  try {
    text = apply(errorToString, error, []);
  } catch {
    text = '<error>';
  }
  if (tmpNote && refusedUnderTmp(error)) text = `${text}\n${tmpNote}`;
  return end === 0 ? text : `${text}\n    at ${apply(join, apply(slice, trace, [0, end]), ['\n    at '])}`;
}

// Where /tmp is not the run's own (modes.Mode.tmp_note in the service): a refused write to a literal
// /tmp path says where to write instead, on the line after the error's message in its stack (what
// node prints for an uncaught error, and what the code prints of one it caught). The run's own
// directory is learnt before the code runs (it may change TMPDIR or its working directory).
let tmpNote = '';
let ownDir = ''; // with a trailing slash
const { resolve: resolvePath } = require('path');
const { startsWith } = String.prototype;

function noteTmpElsewhere(template) {
  const dir = process.env.TMPDIR || process.cwd();
  ownDir = dir.endsWith('/') ? dir : `${dir}/`;
  tmpNote = template.split('{tmpdir}').join(dir);
}

function underLiteralTmp(name) {
  if (typeof name !== 'string') return false;
  const path = resolvePath(ownDir, name);
  return (path === '/tmp' || apply(startsWith, path, ['/tmp/'])) && !apply(startsWith, `${path}/`, [ownDir]);
}

function refusedUnderTmp(error) {
  try {
    if (error === null || typeof error !== 'object') return false;
    const { code } = error;
    return (code === 'EACCES' || code === 'EROFS') && (underLiteralTmp(error.path) || underLiteralTmp(error.dest));
  } catch {
    return false; // a getter of the code's own that throws: the stack as it is
  }
}

let crashing = false; // node prints an uncaught exception after 'exit': leave that exit to node

// Taken before any user code exists: redefining them later changes nothing below.
const { apply } = Reflect;
const { slice, indexOf } = Array.prototype;
const { writeSync } = fs;
const { listeners: listenersOf } = process;
const { reallyExit } = process;
const REPORT_FD = 3; // the ready pipe, kept open for this report (see runner.py)
const report = new Uint8Array(1);

// Node's own exit tears the whole VM down, milliseconds the kernel does better. Registered
// after the user's synchronous code, this runs the 'exit' listeners the user adds later
// itself, reports the exit status on fd 3 (the service answers at once and kills what is
// left), then leaves the way process.exit() does, with the same code. (Removing it only
// makes the run's own exit slower.)
function exitNow(code) {
  if (crashing) return;
  const listeners = apply(listenersOf, process, ['exit']);
  const later = apply(slice, listeners, [apply(indexOf, listeners, [exitNow]) + 1]);
  for (let i = 0; i < later.length; i++) apply(later[i], process, [code]);
  const status = process.exitCode || 0;
  try {
    report[0] = status & 0xff; // what the kernel would report: the low byte
    writeSync(REPORT_FD, report);
  } catch {
    // no report: the service waits for the process to end instead
  }
  apply(reallyExit, process, [status]);
}

// What ends a process by default (signal(7)), less what node handles or ignores itself
// (SIGINT is node's only while it has listeners: then it is not the default; SIGUSR1 starts
// the inspector; SIGPIPE is ignored).
const ENDING = new Set([1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 14, 15, 16, 24, 25, 26, 27, 29, 30, 31]);
for (let signum = 34; signum <= 64; signum++) ENDING.add(signum);
const signalNames = Object.create(null);
for (const [name, number] of Object.entries(os.constants.signals)) signalNames[number] = name;

function endBySignal(signum) {
  try {
    writeSync(REPORT_FD, new Uint8Array([0x21, signum])); // protocol.KILLED_BY, then the signal
  } catch {
    // no report: the service sees the exit status
  }
  apply(reallyExit, process, [128 + signum]);
}

function signalShim() {
  const { kill: realKill, abort: realAbort, listenerCount } = process;
  process.kill = function kill(pid, signal = 'SIGTERM') {
    const signum = typeof signal === 'number' ? signal : os.constants.signals[signal];
    const name = signalNames[signum];
    if (pid == process.pid && ENDING.has(signum) && !(name && apply(listenerCount, process, [name]))) {
      endBySignal(signum);
    }
    return apply(realKill, process, [pid, signal]);
  };
  process.abort = function abort() {
    endBySignal(6);
    apply(realAbort, process, []);
  };
}

warm(); // when building a snapshot, it is in the snapshot: runs start warm
if (v8.startupSnapshot && v8.startupSnapshot.isBuildingSnapshot()) {
  v8.startupSnapshot.setDeserializeMainFunction(() => main(process.argv.slice(1)));
} else {
  main(process.argv.slice(2));
}
