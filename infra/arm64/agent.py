"""The arm64 machine's control agent (run by serve-init): reads one JSON request a line from the virtio port
`ctl` (the host's end is a unix socket in its own mode-700 run directory), runs its shell command, and
answers one JSON line: {"id", "rc", "out"}. `poweroff` as the command syncs and powers the machine off."""

import json
import os
import subprocess
import sys
import time


def main(path: str) -> None:
    port = os.open(path, os.O_RDWR)
    reader = os.fdopen(port, "rb", buffering=0)
    buffer = b""
    while True:
        chunk = reader.read(65536)
        if not chunk:
            time.sleep(0.2)  # no host connected: a virtio port reads empty until one is
            continue
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            try:
                request = json.loads(line)
            except ValueError:
                continue
            if request.get("cmd") == "poweroff":
                os.sync()
                with open("/proc/sysrq-trigger", "w") as trigger:
                    trigger.write("o")
            try:
                done = subprocess.run(
                    ["/bin/bash", "-c", request["cmd"]],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    timeout=request.get("timeout", 600),
                )
                answer = {"rc": done.returncode, "out": done.stdout.decode(errors="replace")}
            except subprocess.TimeoutExpired as e:
                answer = {"rc": 124, "out": (e.stdout or b"").decode(errors="replace") + "\n(timed out)"}
            answer["id"] = request.get("id")
            data = json.dumps(answer).encode() + b"\n"
            while data:  # a port takes a large answer in parts (a whole JUnit XML was cut, and its asker waited)
                data = data[os.write(port, data) :]


if __name__ == "__main__":
    main(sys.argv[1])
