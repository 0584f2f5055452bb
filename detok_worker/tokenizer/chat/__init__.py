"""Chat templates: rendering (template.py, a sandboxed jinja2 environment as transformers renders them) and where
a tokenizer's templates come from (source.py)."""
