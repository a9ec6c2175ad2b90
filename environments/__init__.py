"""The bundled environment specs (YAML data; this file makes the folder an importable package)."""
