// Sandlot's Node.js wrapper: runs inside the jail, as the first and only script of a
// node process that serves exactly one run.
//
// Everything it does happens before user code exists: it warms what every run
// needs, reads the run request from fd 0 (a 4-byte little-endian length, then
// JSON), and hands the code to V8 as a sloppy-mode script in this context.
// After that it does nothing at all: exit status comes from the kernel, output
// from the pipes, so whatever user code redefines (parseInt, JSON, Buffer,
// console, process.exit, require, Function.prototype) changes nothing it relies on.
// The seccomp filter was loaded before node started; it admits no process
// creation, and no network calls unless the run has network.
'use strict';

const fs = require('fs');
const vm = require('vm');

const layerModules = process.argv[2]; // the dependency layer's node_modules, if any
if (layerModules) module.paths.push(layerModules); // what user code's require() searches

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

// Warm the paths every run takes, while nobody waits. Output pipes block when
// full (node queues in memory otherwise): a flood meets the output cap, not the
// heap limit, and process.exit() loses nothing.
for (const stream of [process.stdout, process.stderr]) {
  if (stream._handle && typeof stream._handle.setBlocking === 'function') stream._handle.setBlocking(true);
}
new vm.Script('void 0', { filename: 'warm.js' }).runInThisContext();
JSON.parse('{"code": "console.log(1)"}');
require('util').format('%s %d %o', 'warm', 1, { warm: [1] }); // what console.log formats with
process.stdout.write(''); // and the path it writes through, with nothing to write

const size = readExact(4).readUInt32LE(0);
const request = JSON.parse(readExact(size).toString('utf8'));
const script = new vm.Script(request.code, { filename: 'main.js' });

globalThis.require = require;
globalThis.module = module;
globalThis.exports = module.exports;
globalThis.__filename = '/tmp/main.js';
globalThis.__dirname = '/tmp';
process.argv = [process.argv[0], '/tmp/main.js'];

script.runInThisContext();
