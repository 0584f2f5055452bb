"""The engines detok runs itself, with no real engine behind: the local engine sources (corpus, echo, trace,
llama-cpp; local.py is their loop on detok's EngineLink) and the test engines (grpc_server.py: the local sources as
a gRPC engine; vllm_worker.py: a model-free vLLM worker). detok_worker imports this package only where one of them
runs (the engine source factory, `detok engine-server`, `detok trace synth`), never in a relay."""
