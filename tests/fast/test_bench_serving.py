"""The serving bench runs llama-bench with the kernels of the llama-server it sits beside."""

from bench.serving import kernel_flags


def test_llama_servers_own_defaults_are_its_flash_attention_and_repacked_weights() -> None:
    assert kernel_flags("") == ["-fa", "auto", "--repack", "1"]


def test_the_kernels_oars_runs_are_asked_for_by_name() -> None:
    assert kernel_flags("-fa off --no-repack") == ["-fa", "off", "--repack", "0"]
    assert kernel_flags("--flash-attn on --threads-http 2") == ["-fa", "on", "--repack", "1"]
