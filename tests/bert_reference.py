"""A BERT sentence embedder in numpy (post-LayerNorm encoder, mean pooling), to check what
llama.cpp computes from a converted GGUF against the model's own safetensors; and a tiny
random BERT in the files of a sentence-transformers folder, to convert in the fast tier."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]  # float64 inside, float32 out


def safetensors_bytes(tensors: dict[str, Array]) -> bytes:
    """`tensors` as a `.safetensors` file (F32)."""
    header: dict[str, Any] = {}
    offset = 0
    for name, array in tensors.items():
        size = array.astype(np.float32).nbytes
        header[name] = {
            "dtype": "F32",
            "shape": list(array.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    body = b"".join(a.astype("<f4").tobytes() for a in tensors.values())
    return struct.pack("<Q", len(head)) + head + body


def tiny_bert(seed: int = 0, hidden: int = 32, layers: int = 2, heads: int = 4) -> dict[str, bytes]:
    """A random BERT with a 40-word WordPiece vocabulary, as a sentence-transformers folder."""
    rng = np.random.default_rng(seed)
    words = ["the", "cat", "sat", "on", "mat", "dog", "ran", "far", "a", "rug", "##s", "##ed", "."]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    vocab += [f"w{i}" for i in range(40 - len(vocab))]
    ffn, positions = 4 * hidden, 64

    def w(*shape: int) -> Array:
        return rng.normal(0, 0.2, shape).astype(np.float32)

    t: dict[str, Array] = {
        "embeddings.word_embeddings.weight": w(len(vocab), hidden),
        "embeddings.position_embeddings.weight": w(positions, hidden),
        "embeddings.token_type_embeddings.weight": w(2, hidden),
        "embeddings.LayerNorm.weight": 1 + w(hidden),
        "embeddings.LayerNorm.bias": w(hidden),
    }
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for part in ("query", "key", "value"):
            t[f"{p}attention.self.{part}.weight"] = w(hidden, hidden)
            t[f"{p}attention.self.{part}.bias"] = w(hidden)
        t[f"{p}attention.output.dense.weight"] = w(hidden, hidden)
        t[f"{p}attention.output.dense.bias"] = w(hidden)
        t[f"{p}attention.output.LayerNorm.weight"] = 1 + w(hidden)
        t[f"{p}attention.output.LayerNorm.bias"] = w(hidden)
        t[f"{p}intermediate.dense.weight"] = w(ffn, hidden)
        t[f"{p}intermediate.dense.bias"] = w(ffn)
        t[f"{p}output.dense.weight"] = w(hidden, ffn)
        t[f"{p}output.dense.bias"] = w(hidden)
        t[f"{p}output.LayerNorm.weight"] = 1 + w(hidden)
        t[f"{p}output.LayerNorm.bias"] = w(hidden)
    t["pooler.dense.weight"] = w(hidden, hidden)  # dropped by the converter
    t["pooler.dense.bias"] = w(hidden)
    config = {
        "architectures": ["BertModel"],
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "max_position_embeddings": positions,
        "layer_norm_eps": 1e-12,
        "type_vocab_size": 2,
        "vocab_size": len(vocab),
    }
    specials = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    tokenizer = {
        "added_tokens": [{"id": i, "content": s, "special": True} for s, i in specials.items()],
        "model": {
            "type": "WordPiece",
            "unk_token": "[UNK]",
            "vocab": {v: i for i, v in enumerate(vocab)},
        },
    }
    tokenizer_config = {k.strip("[]").lower() + "_token": k for k in specials}
    return {
        "config.json": json.dumps(config).encode(),
        "model.safetensors": safetensors_bytes(t),
        "tokenizer.json": json.dumps(tokenizer).encode(),
        "tokenizer_config.json": json.dumps(tokenizer_config).encode(),
        "1_Pooling/config.json": json.dumps({"pooling_mode_mean_tokens": True}).encode(),
    }


def _layer_norm(x: Array, weight: Array, bias: Array, eps: float) -> Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    out: Array = (x - mean) / np.sqrt(var + eps) * weight + bias
    return out


def _gelu(x: Array) -> Array:
    out: Array = 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x**3)))
    return out


def embed(files: dict[str, bytes], ids: list[int]) -> Array:
    """The unit-length mean-pooled embedding of one sequence of token ids (with [CLS]/[SEP])."""
    from oars.bert_gguf import read_safetensors

    config = json.loads(files["config.json"])
    t = {
        k.removeprefix("bert."): v.astype(np.float64)
        for k, v in read_safetensors(files["model.safetensors"]).items()
    }
    eps, heads = config.get("layer_norm_eps", 1e-12), config["num_attention_heads"]
    n = len(ids)
    x = t["embeddings.word_embeddings.weight"][ids] + t["embeddings.position_embeddings.weight"][:n]
    x = x + t["embeddings.token_type_embeddings.weight"][0]
    x = _layer_norm(x, t["embeddings.LayerNorm.weight"], t["embeddings.LayerNorm.bias"], eps)
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}."

        def dense(h: Array, name: str, p: str = p) -> Array:
            out: Array = h @ t[f"{p}{name}.weight"].T + t[f"{p}{name}.bias"]
            return out

        q, k, v = (
            dense(x, f"attention.self.{s}").reshape(n, heads, -1).transpose(1, 0, 2)
            for s in ("query", "key", "value")
        )
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        context = (scores / scores.sum(-1, keepdims=True)) @ v
        attended = dense(context.transpose(1, 0, 2).reshape(n, -1), "attention.output.dense")
        x = _layer_norm(
            x + attended,
            t[f"{p}attention.output.LayerNorm.weight"],
            t[f"{p}attention.output.LayerNorm.bias"],
            eps,
        )
        up = _gelu(dense(x, "intermediate.dense"))
        x = _layer_norm(
            x + dense(up, "output.dense"),
            t[f"{p}output.LayerNorm.weight"],
            t[f"{p}output.LayerNorm.bias"],
            eps,
        )
    pooled = x.mean(0)
    unit: Array = (pooled / np.linalg.norm(pooled)).astype(np.float32)
    return unit
