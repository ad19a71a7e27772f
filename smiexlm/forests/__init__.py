"""Random forests, the classical reference and the model's partner: ``baseline`` (a forest
on ECFP4 bits, RDKit 2D descriptors or both, as a row of the MoleculeNet table), ``forest``
(a forest kept beside a fine-tuned model, ``KeptForest``), ``blend`` (a model and a forest
blended molecule by molecule) and ``features`` (the hybrid features and their scaler, which
fine-tuning's hybrid heads share)."""
