"""The HTTP front: the OpenAI-compatible API (app.py, openai_api.py, validation.py, prompts.py, responses.py,
sse.py) over the bus (dispatch.py); server.py runs it as a process."""
