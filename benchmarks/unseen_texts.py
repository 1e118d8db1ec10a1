"""Write the three "unseen" evaluation texts: text that no file of this project and no built-in domain
contains, found on the development machine (Debian and the venv's own dependencies).

    python benchmarks/unseen_texts.py OUT_DIR   # writes licences.txt, node-docs.txt, networkx.txt

- ``licences``: the GPL-3 and Apache-2.0 licence texts from /usr/share/common-licenses (legal prose);
- ``node-docs``: Node.js's ``stream`` API documentation from /usr/share/doc/nodejs (technical Markdown
  with JavaScript examples);
- ``networkx``: networkx's weighted shortest-path module (Python source from outside the standard library).

A recipe that wins only on the built-in held-out domains has not won: these are the check. Each file's
SHA-256 is printed so that a measurement names exactly what it scored.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import networkx

SOURCES = {
    "licences": [Path("/usr/share/common-licenses/GPL-3"), Path("/usr/share/common-licenses/Apache-2.0")],
    "node-docs": [Path("/usr/share/doc/nodejs/api/stream.md")],
    "networkx": [Path(networkx.__file__).parent / "algorithms" / "shortest_paths" / "weighted.py"],
}


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, paths in SOURCES.items():
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise SystemExit(f"{name}: {', '.join(missing)} not on this machine")
        text = "\n\n".join(p.read_text(encoding="utf-8") for p in paths)
        target = out / f"{name}.txt"
        target.write_text(text, encoding="utf-8")
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        print(f"{target}  {len(text):,} characters  sha256 {digest[:16]}…  from {', '.join(map(str, paths))}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/unseen"))
