"""The product's measurements, each a figure set against a reference run beside it.

`python -m bench.run` (`make bench`) prints the targets table (`bench.targets`), measured by
`bench.foundation`, `bench.steps` (against llama-server) and `bench.gateway_load`; the other
modules are scenarios beside it, each runnable on its own (`python -m bench.NAME --help`).
`bench.servers`, `bench.clients` and `bench.prompts` are what they share: server processes on
free ports, runs rotated between the sides compared, medians, tables, timed streams and
reproducible prompts. `bench.lab` holds one-off investigations. Benches use only public names
of `oars` and nothing of `tests/`; `tests/` uses nothing of `bench/`.
"""
