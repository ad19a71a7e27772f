"""Partitioned, resumable outputs of batch jobs: ``smiexlm embed``/``predict`` into a folder.

An input of N rows is cut into parts of ``part_rows`` consecutive rows: part ``i`` holds
input rows ``[i·part_rows, (i+1)·part_rows)``, in input order, whoever writes it. The folder::

    OUT/manifest.json          the job (input sha256, model sha256, settings, part_rows); once
                               complete, also its parts, row and reject counts, per-rank figures
    OUT/part-00000.parquet     the output rows of part 0 (id columns, SMILES, results)
    OUT/part-00000.json        the commit record of part 0: range, counts, bad rows with reasons,
                               the Parquet file's size and sha256
    OUT/rejects.csv            every bad row (row, smiles, reason), in input order, at the end

Each part is written under temporary names and renamed into place, the record first and the
Parquet file last: a part counts as finished only when both are there, so a killed job leaves
finished parts whole and nothing half-written under a final name. Running the same command
again resumes: a manifest that matches the input, the model and the settings is taken up, the
finished parts are checked against the size and sha256 of their records and skipped (never
rewritten, never duplicated), and the others are written; a damaged part (changed in place,
truncated) is written again, and the run says so. A manifest of another job is refused with
the field that differs. Bad rows stay in the output (NaN results) so that row ``r`` of the
table is input row ``r``; their reasons are in the records and in ``rejects.csv``. A job none
of whose rows succeeded (the wrong ``--smiles-col``) keeps nothing: its parts are removed and
it fails with the first rows' reasons.

Under ``torchrun`` every rank reads the input and writes the parts ``i`` with
``i % world_size == rank`` (:mod:`smiexlm.training.workers`); after a barrier rank 0 checks that
every part is there and writes the final manifest.

The modules: :mod:`~smiexlm.parts.job` (names, the job and its records, what a chunk and a
run give back), :mod:`~smiexlm.parts.resume` (a folder's manifest and finished parts),
:mod:`~smiexlm.parts.writing` (:func:`~smiexlm.parts.writing.run_parts`) and
:mod:`~smiexlm.parts.reading` (:func:`~smiexlm.parts.reading.read_parts`, one table in input
order, and :func:`~smiexlm.parts.reading.iter_parts`, one part at a time).
"""
