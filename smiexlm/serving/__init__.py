"""Serving fine-tuned folders and encoders: ``prediction`` (``predict``: one folder or the
seeds of a run as an ensemble, with their trust columns), ``served`` (one folder's scores and
blend members), ``predict_trust`` (the domain and conformal columns), ``predict_parts`` (a
table into one CSV or resumable Parquet parts), ``onnx_predictor`` (a fine-tuned folder's
exported graph behind ``smiexlm predict --backend onnx``; the graphs, their export and the
checked onnxruntime sessions live with the embedding, :mod:`smiexlm.embedding`)."""
