"""The engine sources, one family: each is the engine loop of docs/protocol.md section 5 around an EngineLink, and
factory.py picks one by engine.source.

- relays to a real engine, which schedules: `grpc` (grpc_gateway.py: the token-only gRPC API of vLLM `--grpc`,
  SGLang, TRT-LLM, MLX) and `vllm` (vllm_source.py: vLLM's engine core read directly);
- local sources, run by one loop in this process (local.py): `corpus`, `echo`, `trace` plan each request's ids
  at Submit (planned.py; the shipped corpus is corpus/, its ids cached on disk by corpus_ids.py), `llama-cpp`
  generates them with a real model (llama.py); fake_logprobs.py gives the planned ids deterministic logprobs.

The interface (base.py): a source's loop is an `EngineRun`; a local one is a `TokenSource` or a
`GeneratingSource`."""
