"""Serving fine-tuned folders and encoders: ``prediction`` (``predict``: one folder or the
seeds of a run as an ensemble, with their trust columns), ``served`` (one folder's scores and
blend members), ``predict_trust`` (the domain and conformal columns), ``predict_parts`` (a
table into one CSV or resumable Parquet parts); ONNX export of an encoder or a fine-tuned
model (``onnx_export``, the graphs in ``graph``) and onnxruntime sessions over them
(``onnx_runtime``), behind ``Featurizer(..., backend="onnx")`` and ``smiexlm predict
--backend onnx``."""
