"""The pretraining data pipeline: sources -> documents -> tokenizer -> instances -> masked batches.

    config.py          ``DataConfig`` and ``SourceConfig``, the leaf every stage takes its config from (no torch)
    corpus.py          sources (Hub, JSONL, Parquet, text, ``python_docs``) read into one stream of documents, the
                       split into training and validation documents
    tokenizer.py       a named WordPiece tokenizer checked for BERT's needs, or one trained on the training documents
    instances.py       documents -> sentences -> token ids -> NSP or packed instances, as in BERT's original code
    instance_cache.py  the prepared instances' cache: made shard by shard, resumable, one preparation per key
    cache.py           content-keyed folders under ``data.cache_dir`` and the lock that makes each once
    collator.py        ``MaskingCollator``: padding and BERT's dynamic 80/10/10 masking
    loaders.py         the epoch-seeded sampler and the train and validation loaders
    vocabulary.py      one vocabulary for a whole run, and the data fingerprint a resume checks
    pipeline.py        ``build_pretraining_data``, which runs the stages above; ``prepared``
"""
