"""From a user's tokenizer spec to a loaded backend: create_tokenizer (factory.py), detection (detect.py), the
backend table (routing.py), Hub downloads (hub.py) and the side files beside a tokenizer (side_files.py)."""
