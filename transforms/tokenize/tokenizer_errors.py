"""The one error a tokenizer file or its options raise (exit 2, one line): its own module so that the file checks
(transforms/tokenize/file_checks.py, lossy_settings.py) and the format readers (formats.py), which call each
other's checks, need not import each other (tests/unit/house/test_import_cycles.py)."""


class TokenizerError(ValueError):
    """The tokenizer file cannot be read or used, or options that do not fit it (the message names the knob)."""


FormatError = TokenizerError  # what the format readers raise: not a tokenizer file of an accepted format
