"""Chemistry beside the tokenizer: ECFP4 fingerprints and their Tanimoto (``fingerprints``),
the RDKit descriptors' statistics a pretraining corpus is scaled by (``descriptor_stats``), and
how much of a set's chemistry a corpus covers (``coverage``)."""
