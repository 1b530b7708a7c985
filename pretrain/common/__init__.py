"""Tools every command shares (pretraining, fine-tuning, the analyses, the benchmarks, the GPU check).

    atomic.py     the project's one atomic writer (a file, a JSON file, a folder, create-once); standard library only
    cli.py        the one command-line loader: typed dataclasses, YAML presets, ``--key=VALUE`` overrides, ``--help``
    formats.py    the version of every file format the project writes, and the check its readers make
    device.py     the torch device of a command outside Accelerate, and the size of torch's CPU thread pool
    hardware.py   a GPU's data-sheet peak FLOP/s (``train/mfu``), whether a CPU computes bf16 natively
    reporting.py  the one table formatter and figure saver
    roles.py      what each config field is for, declared beside the field; the lists of fields derived from it

``cli.py``, ``roles.py`` and ``atomic.py`` import neither torch nor transformers: a command parses its options, and
``launch/`` writes its files, before anything heavy is imported. Keep this file free of imports.
"""
