"""A BERT sentence-embedding model (Hugging Face files) → a GGUF that llama.cpp runs.

numpy and the `gguf` writer only: no torch, no transformers. The file is what llama.cpp's
`convert_hf_to_gguf.py` writes for a `BertModel` (architecture `bert`, its tensor names from
`gguf`'s own name map, a WordPiece vocabulary in llama.cpp's "phantom space" spelling, the
special tokens and the pooling of the sentence-transformers folder), with the matrices in f16
and the norms, biases, position and token-type embeddings in f32. The output is a pure function of the input files and the
`gguf` version, so its sha256 can be pinned.
"""

from __future__ import annotations

import json
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import numpy.typing as npt

from oars.errors import SetupError

# The files of a model folder the conversion reads (others are ignored).
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
POOLING = "1_Pooling/config.json"
TOKENIZER = "tokenizer.json"
TOKENIZER_FILES = (TOKENIZER, "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")

_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
_DROPPED = ("embeddings.position_ids", "pooler.", "cls.")
# Tensors llama.cpp adds to f32 activations stay f32, as llama.cpp's converter keeps them.
_ADDED = ("position_embd.", "token_types.")


def read_safetensors(data: bytes) -> dict[str, npt.NDArray[Any]]:
    """The tensors of a `.safetensors` file (F32, F16 or I64), by name."""
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    header.pop("__metadata__", None)
    base = 8 + size
    tensors: dict[str, npt.NDArray[Any]] = {}
    for name, info in header.items():
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise SetupError(f"{name}: tensors of type {info['dtype']} are not supported")
        start, end = info["data_offsets"]
        array = np.frombuffer(data, dtype=dtype, count=(end - start) // np.dtype(dtype).itemsize,
                              offset=base + start)  # fmt: skip
        tensors[name] = array.reshape(info["shape"])
    return tensors


def convert(files: Mapping[str, bytes], out: Path, *, name: str) -> None:
    """Write the GGUF of the model whose files (by path in its folder) are `files`."""
    config = json.loads(files[CONFIG])
    if config.get("architectures", ["BertModel"])[0] not in ("BertModel", "BertForMaskedLM"):
        raise SetupError(f"{name}: not a BERT model ({config.get('architectures')})")
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
    _parameters(writer, config, files, name)
    _vocabulary(writer, config, files)
    _tensors(writer, config, read_safetensors(files[WEIGHTS]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _parameters(
    writer: gguf.GGUFWriter, config: dict[str, Any], files: Mapping[str, bytes], name: str
) -> None:
    writer.add_name(name)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_layer_norm_eps(config.get("layer_norm_eps", 1e-12))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_causal_attention(False)
    writer.add_pooling_type(_pooling(files))


def _pooling(files: Mapping[str, bytes]) -> gguf.PoolingType:
    if POOLING not in files:
        return gguf.PoolingType.MEAN
    pooling = json.loads(files[POOLING])
    if pooling.get("pooling_mode_mean_tokens"):
        return gguf.PoolingType.MEAN
    if pooling.get("pooling_mode_cls_token"):
        return gguf.PoolingType.CLS
    raise SetupError("only mean and CLS pooling are supported")


def _vocabulary(
    writer: gguf.GGUFWriter, config: dict[str, Any], files: Mapping[str, bytes]
) -> None:
    tokenizer = json.loads(files[TOKENIZER])
    if tokenizer["model"]["type"] != "WordPiece":
        raise SetupError(f"a {tokenizer['model']['type']} tokenizer, not WordPiece")
    vocab: dict[str, int] = tokenizer["model"]["vocab"]
    control = {t["id"] for t in tokenizer.get("added_tokens", []) if t.get("special")}
    size = max(config.get("vocab_size", 0), len(vocab))
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    for token, i in vocab.items():
        tokens[i] = token
        types[i] = gguf.TokenType.CONTROL if i in control else gguf.TokenType.NORMAL
    writer.add_token_type_count(config.get("type_vocab_size", 1))
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([_phantom(t, k) for t, k in zip(tokens, types, strict=True)])
    writer.add_token_types(types)
    with tempfile.TemporaryDirectory() as tmp:  # SpecialVocab reads a folder
        for file in TOKENIZER_FILES:
            if file in files:
                (Path(tmp) / file).write_bytes(files[file])
        special = gguf.SpecialVocab(tmp, load_merges=False, n_vocab=size)
    # `gguf` has no key for [CLS] and says so; llama.cpp's WordPiece starts with it anyway
    special.special_token_ids.pop("cls", None)
    special.add_to_gguf(writer, quiet=True)


def _phantom(token: str, kind: gguf.TokenType) -> str:
    """llama.cpp's WordPiece spelling: a word start gains U+2581, a continuation loses `##`."""
    if kind in (gguf.TokenType.CONTROL, gguf.TokenType.UNUSED):
        return token
    return token[2:] if token.startswith("##") else "\u2581" + token


def _tensors(
    writer: gguf.GGUFWriter, config: dict[str, Any], tensors: dict[str, npt.NDArray[Any]]
) -> None:
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, config["num_hidden_layers"])
    for source, array in tensors.items():
        hf = source.removeprefix("bert.")
        if hf.startswith(_DROPPED):
            continue
        target = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        if target is None:
            raise SetupError(f"the tensor {source!r} has no place in llama.cpp's BERT")
        matrix = array.ndim > 1 and not target.startswith(_ADDED)
        writer.add_tensor(target, array.astype(np.float16 if matrix else np.float32))
