"""Which compute devices the llama.cpp build can use (its ggml backends), for `oars serve` to
say where the model runs. llama-cpp-python binds no device listing, so this reads ggml's own
registry through ctypes from the library the package ships."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

_KINDS = {0: "CPU", 1: "GPU", 2: "integrated GPU", 3: "accelerator"}


@dataclass(frozen=True)
class Device:
    name: str  # the backend's device name: CPU, CUDA0, Metal, Vulkan0, …
    description: str
    kind: str

    @property
    def offloads(self) -> bool:
        return self.kind != "CPU"


def devices() -> list[Device]:
    import llama_cpp

    folder = Path(llama_cpp.__file__).parent / "lib"
    found = sorted(folder.glob("libggml.so*")) + sorted(folder.glob("libggml.dylib"))
    if not found:
        return []
    lib = ctypes.CDLL(str(found[0]))
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for fn in (lib.ggml_backend_dev_name, lib.ggml_backend_dev_description):
        fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    listed = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        listed.append(
            Device(
                lib.ggml_backend_dev_name(dev).decode(errors="replace"),
                lib.ggml_backend_dev_description(dev).decode(errors="replace"),
                _KINDS.get(lib.ggml_backend_dev_type(dev), "other"),
            )
        )
    return listed


def gpu_layers(requested: int | None) -> int:
    """Layers to offload: as asked, or (None) all of them when the build can offload."""
    import llama_cpp

    if requested is not None:
        return requested
    return -1 if llama_cpp.llama_supports_gpu_offload() else 0


def describe(layers: int) -> str:
    """One line for the startup banner: the devices, and what is offloaded to them."""
    listed = devices()
    names = ", ".join(f"{d.name} ({d.description})" for d in listed) or "unknown"
    if layers == 0 or not any(d.offloads for d in listed):
        return f"devices {names}; running on the CPU"
    return f"devices {names}; {'all' if layers < 0 else layers} layers offloaded"
