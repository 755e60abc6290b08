"""Everything the tuner knows about vLLM itself: its knobs and their valid values, how a
trial's settings become a ``vllm serve`` command, what its log says it really ran
(effective configuration, compile cache, fatal lines) and whether that matches what was
asked. Pure: text and data in, data out."""
