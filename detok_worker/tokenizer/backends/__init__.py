"""Tokenizer backends, one module each: Hugging Face tokenizer.json (hf.py, hf_token_bytes.py), tiktoken
rank files and named encodings (tiktoken.py), SentencePiece (sentencepiece.py), GGUF metadata (gguf.py), Mistral
Tekken (mistral.py), any Python class (python.py) and a mock (mock.py)."""
