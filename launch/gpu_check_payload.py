"""The data half of launch/prepare_gpu_check.sh: a gzip JSON Lines copy of the corpus and the GLUE MRPC folder in the
payload folder, within what travels to the GPU machine (64 MiB with the working tree and the wheels).

    python launch/gpu_check_payload.py --corpus DIR_OR_FILES --glue GLUE --payload .gpu_payload [--limit-mib 64]

The corpus copy keeps only the text of each document ({"text": ...}; ``datasets`` reads .jsonl.gz directly). When
the whole corpus does not fit, each source file keeps the share of the room its raw size has, in file order, and
the copy says how many documents it kept. Exit code 2, with the sizes, when the payload cannot fit.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MIB = 2**20
MARGIN_BYTES = 1 * MIB  # files the check or a later commit adds to the tree
MIN_CORPUS_BYTES = 1 * MIB  # less would not feed three BERT-base runs of even a few dozen steps


def tree_bytes(repo: Path) -> int:
    """Bytes of what travels with every device call: tracked files plus untracked files git does not ignore."""
    listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                             capture_output=True, check=True).stdout  # fmt: skip
    total = 0
    for name in listing.decode().split("\0"):
        path = repo / name
        if name and path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def corpus_files(corpus: Path) -> list[Path]:
    if corpus.is_file():
        return [corpus]
    files = sorted(p for p in corpus.glob("*") if p.name.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")))
    if not files:
        raise ValueError(f"--corpus {corpus}: no .jsonl/.json(.gz) files in it")
    return files


def open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.name.endswith(".gz") else open(path, encoding="utf-8")


def copy_corpus(files: list[Path], out_dir: Path, room: int) -> dict[str, Any]:
    """Each source file -> out_dir/NAME.jsonl.gz with the text only, within its share of ``room`` bytes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = {f: f.stat().st_size for f in files}
    report: dict[str, Any] = {"files": {}}
    for f in files:
        share = room * raw[f] / sum(raw.values())
        name = f.name.removesuffix(".gz").removesuffix(".jsonl").removesuffix(".json") + ".jsonl.gz"
        target = out_dir / name
        kept = total = 0
        with (
            open(target, "wb") as sink,
            gzip.GzipFile(fileobj=sink, mode="wb", compresslevel=9, mtime=0) as gz,
            open_text(f) as source,
        ):
            for line in source:
                if not line.strip():
                    continue
                total += 1
                if sink.tell() >= share:
                    continue  # count the rest: the report says what was left out
                text = json.loads(line).get("text")
                if text:
                    gz.write((json.dumps({"text": text}, ensure_ascii=False) + "\n").encode())
                    kept += 1
        report["files"][name] = {"documents_kept": kept, "documents_in_source": total, "bytes": target.stat().st_size}
    return report


def copy_glue(glue: Path, out_dir: Path) -> None:
    source = glue / "MRPC"
    missing = [n for n in ("train.tsv", "dev.tsv") if not (source / n).is_file()]
    if missing:
        raise ValueError(
            f"--glue {glue}: MRPC/{' and MRPC/'.join(missing)} not found (the GLUE layout: GLUE/MRPC/train.tsv)"
        )
    (out_dir / "MRPC").mkdir(parents=True, exist_ok=True)
    for name in ("train.tsv", "dev.tsv"):
        shutil.copyfile(source / name, out_dir / "MRPC" / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True, help="a JSON Lines file or a folder of them")
    parser.add_argument("--glue", type=Path, required=True, help="folder with MRPC/train.tsv and MRPC/dev.tsv")
    parser.add_argument("--payload", type=Path, default=REPO / ".gpu_payload", help="the git-ignored payload folder")
    parser.add_argument("--limit-mib", type=float, default=64.0, help="what may travel per device call, in MiB")
    args = parser.parse_args(argv)
    try:
        files = corpus_files(args.corpus)
        for name in ("corpus", "glue"):
            shutil.rmtree(args.payload / name, ignore_errors=True)
        copy_glue(args.glue, args.payload / "glue")
    except (ValueError, FileNotFoundError) as err:
        print(f"prepare_gpu_check: {err}", file=sys.stderr)
        return 2
    limit = int(args.limit_mib * MIB)
    fixed = {
        "working tree": tree_bytes(REPO),
        "wheels": folder_bytes(args.payload / "wheels"),
        "glue": folder_bytes(args.payload / "glue"),
    }
    room = limit - sum(fixed.values()) - MARGIN_BYTES
    if room < MIN_CORPUS_BYTES:
        sizes = ", ".join(f"{k} {v / MIB:.1f} MiB" for k, v in fixed.items())
        print(f"prepare_gpu_check: no room for the corpus within {args.limit_mib:.0f} MiB ({sizes}); carry fewer "
              "wheels (EXTRA_WHEELS) or shrink the tree", file=sys.stderr)  # fmt: skip
        return 2
    report = copy_corpus(files, args.payload / "corpus", room)
    sizes = {**fixed, "corpus": folder_bytes(args.payload / "corpus")}
    total = sum(sizes.values())
    report.update(sizes_bytes=sizes, total_bytes=total, limit_bytes=limit)
    (args.payload / "payload.json").write_text(json.dumps(report, indent=2) + "\n")
    for name, info in report["files"].items():
        print(f"corpus/{name}: {info['documents_kept']} of {info['documents_in_source']} documents, "
              f"{info['bytes'] / MIB:.1f} MiB")  # fmt: skip
    print("travels per call: " + ", ".join(f"{k} {v / MIB:.1f} MiB" for k, v in sizes.items())
          + f"; total {total / MIB:.1f} of {args.limit_mib:.0f} MiB")  # fmt: skip
    if total > limit:
        print(f"prepare_gpu_check: the payload is over {args.limit_mib:.0f} MiB", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
