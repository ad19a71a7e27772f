"""The embedding path, the layer that reads a model folder and serves its embedding:
:class:`~smiexlm.embedding.featurizer.Featurizer` and its report (``report``), whitening fitted
on a corpus (``whitening_fit``), the ONNX graphs (``onnx_graph``), their export
(``onnx_export``) and checked onnxruntime sessions (``onnx_runtime``); a table embedded into
resumable parts (``embed``), nearest-neighbour search over them (``search``), and the
scikit-learn and DeepChem adapters (``integrations``). Fine-tuning stands on it: its kernel
members read the frozen embedding."""
