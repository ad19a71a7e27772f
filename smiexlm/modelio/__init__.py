"""Model folders, read and written: ``layout`` (every file's name, shipped models by name),
``weights`` (config, vocabulary and weights, checked before they are trusted), ``shards``
(weights split into files of at most N MiB), ``integrity`` (checksums, headers, finite
tensors), ``records`` (the small JSON records: embedding, normalisation, corpus tokens,
ONNX), ``folder`` (``ModelFolder`` and ``FinetunedFolder``, each file read once) and
``pretrained`` (``load_pretrained``: a model with its tokenizer and normalisation). It sits
above the network (:mod:`smiexlm.model`), which never imports it at its top."""
