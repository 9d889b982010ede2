"""Node.js runs: Dify's wrapper, hostile JS, and a wrapper that cannot be hijacked."""

import base64
import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import needs_root
from service import Service, descendants, expected_processes, wait_for

from runtimes.config import default_data_dir
from runtimes.jail import protocol
from runtimes.nodejs import runtime as nodejs_runtime
from runtimes.nodejs import snapshot

NODE = "/usr/bin/node"

DIFY_JS_WRAPPER = """
// declare main function
function main({a, b}) {
    return {sum: a + b, text: "héllo"}
}

// decode and prepare input object
var inputs_obj = JSON.parse(Buffer.from('%s', 'base64').toString('utf-8'))

// execute main function
var output_obj = main(inputs_obj)

// convert output to json and print
var output_json = JSON.stringify(output_obj)
var result = `<<RESULT>>${output_json}<<RESULT>>`
console.log(result)
"""


def run(service, code, **fields):
    envelope = service.run(code, language="nodejs", **fields)
    assert envelope["code"] == 0, envelope
    return envelope["data"]


def test_dify_js_wrapper(service):
    inputs = base64.b64encode(json.dumps({"a": 2, "b": 40}).encode()).decode()
    data = run(service, DIFY_JS_WRAPPER % inputs, enable_network=True)
    assert data["stdout"] == '<<RESULT>>{"sum":42,"text":"héllo"}<<RESULT>>\n'
    assert data["error"] == "" and data["exit_code"] == 0


def test_sloppy_mode_script(service):
    data = run(service, "obj = {a: 1}\nundeclared = 2\nconsole.log(obj.a + undeclared, typeof require)")
    assert data["stdout"] == "3 function\n"


def test_exit_codes_and_stdin(service):
    assert run(service, "process.exitCode = 3")["exit_code"] == 3
    assert run(service, "process.exit(4)")["exit_code"] == 4
    data = run(service, "console.log(require('fs').readFileSync(0, 'utf8').toUpperCase())", stdin="abc")
    assert data["stdout"] == "ABC\n"


def test_environment_is_scrubbed(service):
    data = run(service, "console.log(JSON.stringify(Object.keys(process.env).sort()))")
    assert data["stdout"] == '["HOME","LANG","TMPDIR"]\n'


def test_child_process_in_every_form_fails(service):
    cp = "const report = e => console.log('failed', e && e.code); const cp = require('child_process');\n"
    attempts = {
        "spawn": "try { cp.spawn('ls').on('error', report) } catch (e) { report(e) }",
        "exec": "try { cp.exec('ls', report) } catch (e) { report(e) }",
        "execSync": "try { cp.execSync('ls') } catch (e) { report(e) }",
        "fork": "try { cp.fork('/tmp/x.js').on('error', report) } catch (e) { report(e) }",
        "execFileSync": "try { cp.execFileSync('/usr/bin/node', ['-v']) } catch (e) { report(e) }",
    }
    for name, code in attempts.items():
        data = run(service, cp + code)
        assert data["stdout"].startswith("failed EPERM"), (name, data)


def test_internal_bindings_cannot_spawn(service):
    code = (
        "const b = process.binding('spawn_sync');\n"
        "const pipe = {type: 'pipe', readable: true, writable: true};\n"
        "const r = b.spawn({file: '/usr/bin/node', args: ['node', '-e', 'console.log(\"PWNED\")'], envPairs: [],"
        " stdio: [pipe, pipe, pipe]});\n"
        "console.log('spawn error', r.error, r.status, String(r.output && r.output[1]));\n"
    )
    data = run(service, code)
    assert data["stdout"] == "spawn error -1 null null\n"  # -EPERM, no status, no output: nothing ran


@needs_root
@pytest.mark.namespaces  # a tmpfs /tmp, the tree mounted
def test_tmp_is_noexec_so_planted_code_cannot_load(service):
    # a real shared object from the tree, copied to /tmp: loads from the tree, not from /tmp
    code = (
        "const fs = require('fs');\n"
        "const dir = ['/lib/x86_64-linux-gnu', '/lib/aarch64-linux-gnu'].find(d => fs.existsSync(d));\n"
        "const lib = fs.readdirSync(dir).find(f => f.startsWith('libdl.so') || f.startsWith('libgcc_s.so'));\n"
        "fs.copyFileSync(dir + '/' + lib, '/tmp/evil.node');\n"
        "for (const path of [dir + '/' + lib, '/tmp/evil.node']) {\n"
        "  try { process.dlopen({exports: {}}, path) } catch (e) { console.log(path, e.message) } }\n"
    )
    lines = run(service, code)["stdout"].splitlines()
    assert not lines[0].startswith("/tmp") and "Module did not self-register" in lines[0]  # it loaded
    assert lines[1].startswith("/tmp/evil.node") and "failed to map segment" in lines[1]


def test_worker_threads_run_but_cannot_spawn(service):
    code = (
        "const { Worker } = require('worker_threads');\n"
        "const w = new Worker(`const cp = require('child_process');"
        " try { cp.execSync('ls'); require('worker_threads').parentPort.postMessage('ran') }"
        " catch (e) { require('worker_threads').parentPort.postMessage('worker ' + e.code) }`, {eval: true});\n"
        "w.on('message', m => console.log(m));\n"
    )
    assert run(service, code)["stdout"] == "worker EPERM\n"


def test_no_network_without_network(service):
    code = (
        "const net = require('net');\n"
        "const s = net.connect(80, '127.0.0.1');\n"
        "s.on('error', e => console.log('net', e.code));\n"
        "require('http').get('http://127.0.0.1:%d/health', () => console.log('http ok'))"
        ".on('error', e => console.log('http', e.code));\n"
        "require('dns').resolve4('example.com', (e) => console.log('dns', e ? 'failed' : 'ok'));\n" % service.port
    )
    data = run(service, code, enable_network=False)
    assert "net EPERM" in data["stdout"] and "http EPERM" in data["stdout"]
    assert "dns failed" in data["stdout"] and "ok" not in data["stdout"]


@needs_root
@pytest.mark.namespaces  # a tmpfs /tmp, the tree mounted
def test_filesystem_is_the_tree_and_tmp(service):
    code = (
        "const fs = require('fs');\n"
        "for (const p of ['/etc/passwd', '/root', '/proc/self/environ']) {\n"
        "  try { fs.readFileSync(p); console.log('read', p) } catch (e) { console.log(e.code) } }\n"
        "try { fs.writeFileSync('/usr/x', 'x'); console.log('wrote') } catch (e) { console.log(e.code) }\n"
        "fs.writeFileSync('/tmp/ok', 'x'); console.log(fs.readFileSync('/tmp/ok', 'utf8'));\n"
        "console.log(fs.readdirSync('/usr/bin').join(','));\n"
    )
    lines = run(service, code)["stdout"].splitlines()
    assert lines[:3] == ["ENOENT", "ENOENT", "ENOENT"]
    assert lines[3] in ("EROFS", "EACCES")
    assert lines[4] == "x"
    assert lines[5] == "node"  # no binary in the tree but node: exec is of no use


def test_wrapper_cannot_be_hijacked(service):
    attack = (
        "function parseInt() { return 42 }\n"
        "JSON.parse = () => ({code: 'console.log(\"hijacked\")'});\n"
        "JSON.stringify = () => 'forged';\n"
        "Buffer.from = () => { throw new Error('no buffers') };\n"
        "Function.prototype.call = function () { return 'forged' };\n"
        "Function.prototype.apply = function () { return 'forged' };\n"
        "process.exit = () => console.log('exit ignored');\n"
        "require = () => { throw new Error('no require') };\n"
        "console.log('attacker output');\n"
        "console.log = () => {};\n"
        "process.exitCode = 9;\n"
    )
    data = run(service, attack)
    assert data["stdout"] == "attacker output\n"
    assert data["exit_code"] == 9  # what the process really did, not what it pretends
    after = run(service, "console.log(parseInt('7'), JSON.stringify({a: 1}), typeof require)")
    assert after["stdout"] == '7 {"a":1} function\n'


def test_runs_cannot_see_each_other(service):
    # a relative path: the run's own /tmp as root, its own directory in the reduced jail
    run(service, "globalThis.secret = 'run A'; require('fs').writeFileSync('secret', 'run A')")
    data = run(service, "console.log(typeof secret, require('fs').existsSync('secret'))")
    assert data["stdout"] == "undefined false\n"


def test_infinite_loop_times_out(service):
    started = time.monotonic()
    data = run(service, "while (true) {}", timeout=1)
    assert data["exit_code"] == -1 and "error: timeout" in data["error"]
    assert time.monotonic() - started < 3


def test_output_flood_stops_at_the_cap(service):
    data = run(service, "const s = 'x'.repeat(1000); while (true) { process.stdout.write(s) }", timeout=20)
    assert "error: output limit exceeded" in data["error"]
    assert len(data["stdout"]) <= 4 * 1024 * 1024


def test_memory_bomb_names_the_heap(service):
    data = run(service, "const a = []; while (true) { a.push(new Array(1e6).fill(1)) }", timeout=20)
    assert data["exit_code"] != 0
    assert "heap" in data["error"].lower() or "memory" in data["error"].lower()
    buffers = run(service, "const a = []; while (true) { a.push(Buffer.alloc(64 * 1024 * 1024)) }", timeout=20)
    assert buffers["exit_code"] != 0
    assert "memory" in buffers["error"].lower() or "allocation failed" in buffers["error"].lower()


def test_hostile_js_leaves_nothing_behind(service):
    codes = [
        "while (true) {}",
        "require('child_process').execSync('ls')",
        "const a = []; while (true) a.push([1])",
        "process.kill(process.pid, 'SIGKILL')",
    ]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda c: service.run(c, language="nodejs", timeout=2), codes * 2))
    assert all(r["code"] == 0 and r["data"]["exit_code"] != 0 for r in results)
    assert run(service, "console.log('alive')")["stdout"] == "alive\n"
    status = service.detail()["runtimes"]["nodejs"]
    assert status["ready"] is True
    # only zygotes and ready children remain below the service
    assert wait_for(lambda: len(descendants(service.process.pid)) == expected_processes(service))


@pytest.mark.parametrize(
    ("code", "exit_code", "words"),
    [
        ("process.kill(process.pid, 'SIGKILL'); console.log('b')", 137, "killed (signal 9)"),
        ("process.kill(process.pid); setTimeout(() => console.log('b'), 2000)", 143, "killed (signal 15)"),
        ("process.abort()", 134, "aborted (signal 6)"),
    ],
)
def test_a_signal_a_run_sends_itself_ends_it(service, code, exit_code, words):
    """node is the first process of its PID namespace (spared its own signals): the wrapper's shim ends it."""
    data = run(service, code, timeout=10)
    assert data["exit_code"] == exit_code and f"error: {words}" in data["error"] and data["stdout"] == ""


def test_a_run_listening_for_its_own_signal_goes_on(service):
    code = "process.on('SIGTERM', () => { console.log('caught'); process.exit(0) }); process.kill(process.pid)"
    data = run(service, code + "; setTimeout(() => {}, 2000)")
    assert data["exit_code"] == 0 and data["stdout"] == "caught\n"


def test_without_node_the_service_still_serves_python():
    svc = Service(NODEJS_PATH="/nonexistent/node").start()
    try:
        envelope = svc.run("console.log(1)", language="nodejs")
        assert envelope["code"] == -500 and "node is not installed" in envelope["message"]
        assert svc.run("print(1)")["data"]["stdout"] == "1\n"
        detail = svc.detail()["runtimes"]["nodejs"]
        assert detail["installed"] is False and "node is not installed" in detail["error"]
    finally:
        svc.stop()


def test_heap_limit_follows_the_memory_limit(service):
    code = "console.log(Math.round(require('v8').getHeapStatistics().heap_size_limit / 1048576))"
    default = int(run(service, code)["stdout"])  # started from the snapshot
    smaller = int(run(service, code, memory_limit_mb=128)["stdout"])  # started on the plain wrapper
    assert 512 <= default < 700
    assert 128 <= smaller < 300
    data = run(service, "const a = []; while (true) a.push(new Array(1e6).fill(1))", memory_limit_mb=128, timeout=20)
    assert data["exit_code"] != 0 and "heap" in data["error"].lower()


def test_exit_listeners_and_codes_survive_the_fast_exit(service):
    code = (
        "process.on('exit', c => console.log('first', c));\n"
        "setTimeout(() => process.on('exit', c => console.log('late', c, process.exitCode)), 1);\n"
        "setTimeout(() => { process.exitCode = 6 }, 5);\n"
    )
    data = run(service, code)
    assert data["stdout"] == "first 6\nlate 6 6\n" and data["exit_code"] == 6
    assert run(service, "process.removeAllListeners('exit'); console.log('slow but fine')")["exit_code"] == 0
    thrown = run(service, "setTimeout(() => { throw new Error('late failure') }, 1)")
    assert thrown["exit_code"] == 1 and "late failure" in thrown["stderr"]


def test_a_big_output_is_whole_when_the_exit_is_reported(service):
    code = (
        "for (let i = 0; i < 2000; i++) console.log(String(i).padStart(999, '.'));\n"
        "console.error('done');\n"
        "process.on('exit', () => console.log('last words'));\n"
        "process.exit(3);\n"
    )
    data = run(service, code)
    lines = data["stdout"].splitlines()
    assert len(lines) == 2001 and lines[1999].endswith("1999") and lines[-1] == "last words"
    assert data["stderr"] == "done\n" and data["exit_code"] == 3


def test_a_forged_exit_report_only_ends_its_own_run(service):
    started = time.monotonic()
    forged = run(service, "require('fs').writeSync(3, Buffer.from([7])); while (true) {}")
    assert forged["exit_code"] == 7
    assert time.monotonic() - started < 3  # not the timeout: the service stopped it
    assert wait_for(lambda: len(descendants(service.process.pid)) == expected_processes(service))  # and killed it
    # anything but one byte is no report: the run goes on and ends as the process does
    data = run(service, "require('fs').writeSync(3, 'not a status'); console.log('still here')")
    assert data["exit_code"] == 0 and data["stdout"] == "still here\n"


def test_snapshot_loads_without_rehashing_and_runs(tmp_path):
    built = snapshot.build(NODE, nodejs_runtime.WRAPPER, 512, str(tmp_path / "wrapper.blob"))
    assert built is not None and built.flags == ("--max-old-space-size=512", snapshot.NO_REHASH)
    request = protocol.run_input({"code": "console.log(6 * 7, typeof require)"}, "")
    result = subprocess.run([NODE, *built.flags, "--snapshot-blob", built.path], input=request, capture_output=True)
    assert result.stdout == b"42 function\n", result.stderr
    # as built, node refuses to load it with the rehashing flag left out
    refused = subprocess.run([NODE, "--snapshot-blob", built.path], input=request, capture_output=True)
    assert refused.returncode != 0


def test_nodes_tags_are_asked_once_then_read_from_the_data_dir_and_asked_again_where_they_do_not_load(
    tmp_path, monkeypatch
):
    """A snapshot is retagged for loading without rehashing: node's tags (two node starts) are kept in the data
    dir, so that the next start builds its snapshot without asking; a tag kept wrong is asked again, not trusted."""
    cache = tmp_path / "data"
    snapshot._asked_tag.cache_clear()
    first = snapshot.build(NODE, nodejs_runtime.WRAPPER, 512, str(tmp_path / "1.blob"), cache_dir=str(cache))
    assert first is not None and snapshot.NO_REHASH in first.flags
    kept = json.loads((cache / snapshot.TAGS_CACHE).read_text())
    assert len(kept) == 2 and all(type(tag) is int and tag >= 0 for tag in kept.values())
    snapshot._asked_tag.cache_clear()
    asked = []
    real = snapshot._asked_tag

    def counted(node, flags):
        asked.append(flags)
        return real(node, flags)

    monkeypatch.setattr(snapshot, "_asked_tag", counted)
    second = snapshot.build(NODE, nodejs_runtime.WRAPPER, 512, str(tmp_path / "2.blob"), cache_dir=str(cache))
    assert second is not None and second.flags == first.flags and asked == []  # no node asked
    (cache / snapshot.TAGS_CACHE).write_text(json.dumps({key: tag + 1 for key, tag in kept.items()}))
    third = snapshot.build(NODE, nodejs_runtime.WRAPPER, 512, str(tmp_path / "3.blob"), cache_dir=str(cache))
    assert third is not None and third.flags == first.flags and len(asked) == 2
    assert json.loads((cache / snapshot.TAGS_CACHE).read_text()) == kept
    real.cache_clear()


def _code_cache_entries(path: str) -> int:
    """How many modules' code cache the blob at path carries (0 also where it ends with an empty count)."""
    with open(path, "rb") as blob:
        data = blob.read()
    start = snapshot._code_cache_start(data, 0)
    return 0 if start is None else int.from_bytes(data[start : start + 8], "little")


def test_the_snapshot_carries_no_code_cache_and_loads_modules_outside_it(tmp_path):
    as_built = str(tmp_path / "as-built.blob")
    subprocess.run(
        [NODE, "--snapshot-blob", as_built, "--build-snapshot", nodejs_runtime.WRAPPER], check=True, capture_output=True
    )
    built = snapshot.build(NODE, nodejs_runtime.WRAPPER, 512, str(tmp_path / "wrapper.blob"))
    # node writes one for every built-in module (2.5 of its 4.2 MB); each node started on it would copy it
    assert _code_cache_entries(as_built) > 100
    assert built is not None and _code_cache_entries(built.path) == 0
    assert os.path.getsize(built.path) < 0.6 * os.path.getsize(as_built)
    code = (
        "const http = require('http'), crypto = require('crypto'), vm = require('vm');\n"
        "console.log(typeof http.request, crypto.createHash('sha256').update('a').digest('hex').slice(0, 8),"
        " vm.runInNewContext('[1, 2].map((x) => x * 2).join()'), typeof fetch)"
    )
    result = subprocess.run(
        [NODE, *built.flags, "--snapshot-blob", built.path],
        input=protocol.run_input({"code": code}, ""),
        capture_output=True,
    )
    assert result.stdout == b"function ca978112 2,4 function\n", result.stderr


def test_a_snapshot_node_refuses_without_its_code_cache_is_used_as_built(tmp_path, monkeypatch):
    loads = snapshot._loads
    monkeypatch.setattr(
        snapshot, "_loads", lambda node, flags, path: _code_cache_entries(path) > 0 and loads(node, flags, path)
    )
    built = snapshot.build(NODE, nodejs_runtime.WRAPPER, 512, str(tmp_path / "wrapper.blob"))
    assert built is not None and built.flags == ("--max-old-space-size=512", snapshot.NO_REHASH)
    assert _code_cache_entries(built.path) > 100


def test_a_header_that_is_not_nodes_is_left_alone(tmp_path):
    blob = tmp_path / "other.blob"
    blob.write_bytes(b"\x00" * 64)
    assert snapshot._retag(str(blob), 0, 1) is False and blob.read_bytes() == b"\x00" * 64


def test_each_zygote_starts_on_a_snapshot_of_its_own():
    root = os.path.join(os.environ.get("SANDLOT_DATA_DIR") or default_data_dir(), "snapshots")
    before = set(os.listdir(root)) if os.path.isdir(root) else set()
    svc = Service(SANDLOT_ZYGOTE_MAX_FORKS="10", MAX_WORKERS="2").start()
    try:
        # the directory of this service's snapshots (the lock file beside them is new too on a fresh data dir)
        (own,) = [os.path.join(root, name) for name in set(os.listdir(root)) - before if not name.startswith(".")]
        serials = set()
        # 10 forks a zygote: 3 zygotes within 30 runs on a quiet machine; under load a retired zygote serves on while
        # its successor builds its snapshot, so the runs go on until the third is seen (at most 200)
        for _ in range(200):
            assert svc.run("console.log(1)", language="nodejs")["data"]["stdout"] == "1\n"
            serials |= {name for name in os.listdir(own) if name.endswith(".blob")}
            if len(serials) >= 3:
                break
        assert len(serials) >= 3  # a new zygote, a new snapshot, a new hash seed
        assert svc.detail()["runtimes"]["nodejs"]["startup_snapshot"] == "own seed, no rehash"
        assert wait_for(lambda: len(os.listdir(own)) <= 2)  # those of retired zygotes are gone
    finally:
        svc.stop()
    assert not os.path.exists(own)


@needs_root
def test_no_run_can_read_the_snapshot_it_started_from(service):
    code = (
        "const fs = require('fs');\n"
        "const files = [];\n"
        "for (let fd = 0; fd < 1024; fd++) { try { if (fs.fstatSync(fd).isFile()) files.push(fd) } catch (e) {} }\n"
        "console.log(process.execArgv.includes('--snapshot-blob'), fs.existsSync('/tmp/.sandlot-snapshot'),"
        " fs.readdirSync('/opt/sandlot').join(','), JSON.stringify(files))"
    )
    # /opt/sandlot holds the wrapper and the layer (tree.LAYER_IN_TREE), no snapshot; and no descriptor is a file:
    # the zygote's copy (a memfd) that the child copied its own from (runner.py, SNAPSHOT_FD) was closed before node
    assert run(service, code)["stdout"] == "true false layer,wrapper.js []\n"


@needs_root
@pytest.mark.namespaces  # a tmpfs /tmp, the tree mounted
def test_a_tmp_too_small_for_the_snapshot_starts_node_on_the_plain_wrapper():
    svc = Service(SANDLOT_TMP_SIZE_MB="1", MAX_WORKERS="1").start()  # the snapshot is 1.7 MB
    try:
        code = "console.log(process.execArgv.includes('--snapshot-blob'), require('fs').readdirSync('/tmp').length)"
        assert svc.run(code, language="nodejs")["data"]["stdout"] == "false 0\n"
    finally:
        svc.stop()


def test_snapshot_directories_of_instances_gone_are_collected(tmp_path):
    live = snapshot.SnapshotDirectory(str(tmp_path))
    live.open()
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / "wrapper-1.blob").write_bytes(b"seed")
    legacy = tmp_path / "node-0123456789abcdef.blob"  # the layout before per-instance directories
    legacy.write_bytes(b"seed")
    other = snapshot.SnapshotDirectory(str(tmp_path))
    other.open()
    assert os.path.isdir(live.path) and not stale.exists() and not legacy.exists()
    other.close()
    live.close()
    assert [p.name for p in tmp_path.iterdir()] == [".lock"]
