"""Text adapter: a subword tokenizer and fixed-length text blocks for the same model core."""

from smiexlm.text.tokenizer import TextTokenizer, load_tokenizer

__all__ = ["TextTokenizer", "load_tokenizer"]
