"""The WordPiece tokenizer: a named one (Hub or local folder) checked for BERT's needs, or one trained on the
training documents and cached under ``data.cache_dir``."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from itertools import islice
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, BertTokenizerFast, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from pretrain.common.atomic import atomic_dir, is_damage
from pretrain.common.roles import keyed_in
from pretrain.data.cache import CACHE_FORMAT_VERSION, content_hash
from pretrain.data.config import MIN_PLAUSIBLE_VOCAB, DataConfig
from pretrain.data.corpus import document_texts, source_fingerprint, split_corpus

# Order fixes the ids of a trained tokenizer: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4.
SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def train_wordpiece_tokenizer(texts: Iterable[str], *, vocab_size: int, lowercase: bool = True) -> BertTokenizerFast:
    """A BERT WordPiece tokenizer trained on ``texts`` (BERT normaliser and pre-tokenizer, [CLS]/[SEP] template)."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    # show_progress off: the trainer's bars (blank lines off a terminal) would precede the instances' own bar.
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), min_frequency=2,
                                        show_progress=False)  # fmt: skip
    tok.train_from_iterator(texts, trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])  # fmt: skip
    return BertTokenizerFast(tokenizer_object=tok, do_lower_case=lowercase, strip_accents=lowercase)


# A tokenizer has two identities (both fixed: existing runs' keys stay): vocab_hash, what a checkpoint's embedding
# rows mean (the processes of a run and its resumes must agree; part of the batches' fingerprint), and pipeline_hash,
# what the prepared instances are made with (a changed normaliser with the same vocabulary makes other instances).


def vocab_hash(tokenizer: PreTrainedTokenizerBase | Tokenizer) -> str:
    """The vocabulary's identity (token -> id, added tokens included), whatever the tokenizer's name or folder."""
    return hashlib.sha256(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode()).hexdigest()


def pipeline_hash(tokenizer: PreTrainedTokenizerFast) -> str:
    """The identity of everything that turns text into ids: the backend tokenizer's serialisation."""
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()


def check_tokenizer(tokenizer: PreTrainedTokenizerBase, *, name: str, model_vocab_size: int | None = None) -> None:
    """Reject tokenizers that cannot feed BERT pretraining, with the fix in the message."""
    if not tokenizer.is_fast:
        raise ValueError(f"tokenizer {name!r} is not a fast (Rust) tokenizer; pretraining needs one")
    size = len(tokenizer)
    if size < MIN_PLAUSIBLE_VOCAB:
        raise ValueError(
            f"tokenizer {name!r} has only {size} tokens; that is not a real vocabulary (a wrong name or folder can "
            f"load a stub). Check data.tokenizer, or set it to null to train a WordPiece tokenizer"
        )
    missing = [t for t in ("cls_token", "sep_token", "mask_token", "pad_token") if getattr(tokenizer, t) is None]
    missing += [t for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]") if t not in tokenizer.get_vocab()]
    if missing:
        raise ValueError(f"tokenizer {name!r} lacks BERT special tokens {missing}; use a BERT (WordPiece) tokenizer")
    if model_vocab_size is not None and size > model_vocab_size:
        raise ValueError(
            f"tokenizer {name!r} has {size} tokens but the model's vocabulary has {model_vocab_size}; "
            f"set model.vocab_size >= {size} (or a smaller data.vocab_size for a trained tokenizer)"
        )


def _load_folder(path: Path, what: str, fix: str) -> PreTrainedTokenizerFast:
    """The tokenizer ``save_pretrained`` wrote into ``path``; unreadable: ValueError naming it and ``fix``."""
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as err:  # a damaged tokenizer.json: a JSON error, or the tokenizers library's bare Exception
        if not is_damage(err):
            raise
        raise ValueError(f"{what}: the tokenizer in {path} cannot be read ({err}): its files are damaged or not a "
                         f"tokenizer's; {fix}") from None  # fmt: skip


def _load_named_tokenizer(name: str) -> PreTrainedTokenizerFast:
    path = Path(name).expanduser()
    looks_local = path.is_absolute() or name.startswith((".", "~")) or path.exists()
    if looks_local and not path.is_dir():
        raise FileNotFoundError(f"data.tokenizer={name!r}: no such tokenizer folder ({path.resolve()})")
    if looks_local:
        fix = "restore it from a copy (a run's RUN/tokenizer: each of its snapshots holds one), or name another folder"
        return _load_folder(path, f"data.tokenizer={name!r}", fix)
    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as e:  # not on the Hub, offline, or no tokenizer files in the repo
        raise ValueError(
            f"data.tokenizer={name!r}: tokenizer not found (neither a local folder nor loadable from the Hugging Face "
            f"Hub: {e}). Fix the name, or set data.tokenizer to null to train a WordPiece tokenizer"
        ) from e


# DataConfig fields a trained tokenizer depends on (keyed_in "tokenizer"); the sources by their content's fingerprint.
_TOKENIZER_KEY_FIELDS = keyed_in(DataConfig, "tokenizer")


def _tokenizer_cache_key(cfg: DataConfig, seed: int) -> str:
    fields = {k: getattr(cfg, k) for k in _TOKENIZER_KEY_FIELDS}
    fields["sources"] = [source_fingerprint(s, i) for i, s in enumerate(cfg.sources)]
    return content_hash({"version": CACHE_FORMAT_VERSION, "seed": seed, **fields})


def trained_tokenizer_dir(cfg: DataConfig, seed: int) -> Path:
    """Where the WordPiece tokenizer trained for this config is cached."""
    return Path(cfg.cache_dir) / f"tokenizer-{_tokenizer_cache_key(cfg, seed)}"


def cached_tokenizer(
    cfg: DataConfig, *, seed: int = 0, trained_elsewhere: Path | None = None
) -> PreTrainedTokenizerFast | None:
    """The tokenizer when it needs no training: the one ``data.tokenizer`` names, or the WordPiece tokenizer this
    config trained before (in the cache); None when it is still to be trained.

    ``trained_elsewhere``: the copy another process of the same run trained and saved, taken into a cache that has
    none rather than trained again: two nodes with their own caches would otherwise train two vocabularies."""
    if cfg.tokenizer is not None:
        return _load_named_tokenizer(cfg.tokenizer)
    cached = trained_tokenizer_dir(cfg, seed)
    if not cached.is_dir():
        if trained_elsewhere is None:
            return None
        with atomic_dir(cached) as tmp:
            AutoTokenizer.from_pretrained(str(trained_elsewhere)).save_pretrained(tmp)
    what = f"data.cache_dir={cfg.cache_dir!r}"
    fix = "remove that folder to train it again (a new vocabulary: the instances are made again for it)"
    # Published whole (atomic_dir): a file of it missing was removed since. Without tokenizer.json transformers
    # builds a tokenizer of the special tokens alone, without tokenizer_config.json one without them.
    if missing := [name for name in ("tokenizer.json", "tokenizer_config.json") if not (cached / name).is_file()]:
        raise ValueError(f"{what}: the tokenizer in {cached} lacks {', '.join(missing)} (removed since it was "
                         f"saved); {fix}")  # fmt: skip
    return _load_folder(cached, what, fix)


def load_or_train_tokenizer(
    cfg: DataConfig, *, save_dir: Path | None = None, model_vocab_size: int | None = None, seed: int = 0,
    training_texts: Callable[[], Iterable[str]] | None = None, trained_elsewhere: Path | None = None,
    loaded: PreTrainedTokenizerFast | None = None,
) -> PreTrainedTokenizerFast:
    """The tokenizer named by ``data.tokenizer``, or a WordPiece tokenizer trained on the training documents and
    cached, checked for BERT's needs and ``model_vocab_size``, and saved to ``save_dir`` when given.

    ``loaded``: what ``cached_tokenizer`` returned for this config, not loaded again. ``training_texts``: the
    training documents' texts (by default the corpus is read and split here). ``trained_elsewhere``: see
    ``cached_tokenizer``."""
    tokenizer = loaded if loaded is not None else cached_tokenizer(cfg, seed=seed, trained_elsewhere=trained_elsewhere)
    name = cfg.tokenizer
    if name is None:
        cached = trained_tokenizer_dir(cfg, seed)
        name = f"WordPiece trained on the corpus ({cached})"
        if tokenizer is None:
            texts = training_texts() if training_texts is not None else document_texts(split_corpus(cfg, seed=seed)[0])
            trained = train_wordpiece_tokenizer(islice(texts, cfg.tokenizer_train_documents), vocab_size=cfg.vocab_size,
                                                lowercase=cfg.lowercase)  # fmt: skip
            with atomic_dir(cached) as tmp:
                trained.save_pretrained(tmp)
            tokenizer = AutoTokenizer.from_pretrained(str(cached))
    check_tokenizer(tokenizer, name=name, model_vocab_size=model_vocab_size)
    if save_dir is not None:
        tokenizer.save_pretrained(save_dir)
    return tokenizer
