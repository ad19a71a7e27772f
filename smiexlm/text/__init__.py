"""Text adapter: fixed-length text blocks for the same model core.

The subword tokenizer lives with the SMILES one: :class:`smiexlm.tokenizer.TextTokenizer`.
"""
