"""The engine sources, one family: each is the engine loop of docs/protocol.md section 5 around an EngineLink, and
factory.py picks one by engine.source.

- relays to a real engine, which schedules: `grpc` (grpc_gateway.py: the token-only gRPC API of vLLM `--grpc`,
  SGLang, TRT-LLM, MLX) and `vllm` (vllm_source.py: vLLM's engine core read directly);
- local sources (`corpus`, `echo`, `trace`, `llama-cpp`): engine_stub's loop in this process, imported by the
  factory when one is chosen.

The interface (base.py): a source's loop is an `EngineRun`."""
