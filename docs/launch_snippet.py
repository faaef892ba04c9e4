#!/usr/bin/env python3
"""Runs a snippet as the docs show it, `ember launch --num_processes N PROGRAM`, on a port that
is free right now (tests run side by side, so the default port 29500 may be taken), and on the
CPU (`--cpu`), so that N ranks run the same on a machine with fewer GPUs than ranks.

Usage: launch_snippet.py EMBER_CLI NUM_PROCESSES PROGRAM [ARGS...]
The exit status and the output are the launcher's.
"""
import socket
import subprocess
import sys


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    if len(sys.argv) < 4:
        sys.stderr.write(__doc__)
        return 2
    cli, processes, program = sys.argv[1], sys.argv[2], sys.argv[3:]
    command = [cli, "launch", "--cpu", "--num_processes", processes, "--main_process_port", str(free_port()), *program]
    print("+", " ".join(command), flush=True)
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
