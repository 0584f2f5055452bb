"""Prompt corpus for the encode-cache tests: multi-turn conversations rendered through each fixture tokenizer's
real chat template (its own, or a Hub-style template where the fixture ships none), plus edge strings.

Holds no tests itself; the test_encode_cache*.py modules import it.
"""

from __future__ import annotations


# The Mistral v1 / Llama-2 [INST] format (what the mistral-sp-v1 family is served with), with BOS and EOS as text.
