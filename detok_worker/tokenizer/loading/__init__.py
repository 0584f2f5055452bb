"""From a user's tokenizer spec to a loaded backend: create_tokenizer (factory.py), detection (detect.py), the
backend table and Hub downloads (routing.py), and the side files beside a tokenizer (side_files.py)."""
