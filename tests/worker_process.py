"""A worker process for the tests, in host-memory mode: attach, hold some memory, follow stdin.

Lines on stdin: ``grow N`` holds N more MiB (touched), ``free`` drops it all; EOF exits (through
`sys.exit`, so the goodbye is sent by atexit). Prints ``attached`` (or ``detached``) once.
"""

from __future__ import annotations

import os
import sys

import gpumem_widget

MiB = 2**20


def main() -> None:
    agent = gpumem_widget.attach()
    print("attached" if agent is not None else "detached", flush=True)
    rank = int(os.environ.get("RANK", "0"))
    held = [b"\x01" * ((rank + 1) * 8 * MiB)]
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["grow"]:
            held.append(b"\x01" * (int(words[1]) * MiB))
        elif words[:1] == ["free"]:
            held.clear()
        print("ok", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
