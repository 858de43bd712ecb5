"""One-off investigations: the instruments of a question about the engine or the store, run by
hand. Nothing in `tests/` imports them, nor does anything in `bench/` outside this package, so
they may break with the code they probe, and each is deleted once its question is answered and
the answer written in `docs/notes/benchmarks-journal.md` (which names the commit that still
has it)."""
