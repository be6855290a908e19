"""Entry point of the node bundle: ``python3 gpuctl-node-<hash>.pyz COMMAND ...``.

Commands: ``agent`` (the GPU agent), ``supervisor`` (runs a VENV2 job; see supervisor.py).
"""

import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write("usage: gpuctl-node {agent,supervisor} [options]\n")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "agent":
        from .agent import main as agent_main

        return agent_main(rest)
    if command == "supervisor":
        try:
            from .supervisor import main as supervisor_main
        except ImportError:
            sys.stderr.write("gpuctl-node: this bundle has no supervisor\n")
            return 2
        return supervisor_main(rest)
    sys.stderr.write("gpuctl-node: unknown command %r (agent, supervisor)\n" % command)
    return 2


if __name__ == "__main__":
    sys.exit(main())
