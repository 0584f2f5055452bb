"""Reasoning and tool-call parsers: pure, incremental splitting of a request's output text into reasoning,
content and tool calls. The worker runs them beside the stop decoder (worker/state.py); `registry.py` names them.
"""
