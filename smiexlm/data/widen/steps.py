"""One block of molecules in, the originals and their widened products out.

:class:`Widener` applies the configured steps to each molecule in turn. A step takes one
molecule of those made so far for the input (the original, or a product of an earlier step),
chosen by the step's seeded generator, so that products compose: a recombined molecule can
be protonated, then made a salt. Every product is checked (:func:`~.chem.finish`), must be
new for this input, and must not be an evaluation molecule (:mod:`.exclusion`); each
outcome is counted per step, and each dropped molecule is listed with its reason.

The BRICS pool of a block is filled from the whole block before any product is made, so a
block's output depends on its own rows and the seed only: a resumed run rebuilds it exactly.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from smiexlm.data.normalize import text_problem, undecoded
from smiexlm.data.widen.brics import FragmentPool, brics_step, fragments
from smiexlm.data.widen.charges import protonate_step, salt_step
from smiexlm.data.widen.chem import StepResult, finish, step_rng
from smiexlm.data.widen.elements import element_step
from smiexlm.data.widen.exclusion import evaluation_key
from smiexlm.data.widen.variants import stereo_step, tautomer_step
from smiexlm.errors import ConfigError, check_choice

STEPS = ("brics", "protonate", "salts", "tautomers", "stereo", "elements")


@dataclass(frozen=True)
class WidenConfig:
    """How a corpus is widened; saved in the report of every run."""

    steps: tuple[str, ...] = STEPS  # applied in this order
    per_molecule: int = 1  # products each step tries to make per input molecule
    seed: int = 0
    min_heavy: int = 20  # BRICS products: heavy-atom range (MoleculeNet's bulk)
    max_heavy: int = 60
    max_joins: int = 12  # BRICS work cap per product
    ph: float = 7.4
    fraction: float = 1.0  # share of the input molecules each step runs on (seeded draw)

    def __post_init__(self) -> None:
        if not self.steps:
            raise ConfigError("steps", self.steps, f"one or more of {', '.join(STEPS)}")
        for step in self.steps:
            check_choice("steps", step, STEPS)
        if len(set(self.steps)) != len(self.steps):
            raise ConfigError("steps", ",".join(self.steps), "each step at most once")
        if not 1 <= self.per_molecule <= 100:
            raise ConfigError("per_molecule", self.per_molecule, "an integer in [1, 100]")
        if not 1 <= self.min_heavy <= self.max_heavy:
            raise ConfigError("min_heavy", self.min_heavy, f"in [1, max_heavy={self.max_heavy}]")
        if self.max_joins < 1:
            raise ConfigError("max_joins", self.max_joins, "at least 1")
        if not 0.0 < self.fraction <= 1.0:
            raise ConfigError("fraction", self.fraction, "a share in (0, 1]")
        if not 0.0 <= self.ph <= 14.0:
            raise ConfigError("ph", self.ph, "a pH in [0, 14]")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "steps": list(self.steps)}


@dataclass
class StepCounts:
    """What one step did over a block: products made, written, dropped and why."""

    made: int = 0
    written: int = 0
    duplicate: int = 0  # the same SMILES as the input or an earlier product of it
    excluded: int = 0  # an evaluation molecule (key in the exclusion set)
    failed: Counter = field(default_factory=Counter)  # reason -> attempts
    skipped: Counter = field(default_factory=Counter)  # reason -> inputs with nothing to do

    def add(self, other: StepCounts) -> None:
        self.made += other.made
        self.written += other.written
        self.duplicate += other.duplicate
        self.excluded += other.excluded
        self.failed.update(other.failed)
        self.skipped.update(other.skipped)

    def to_dict(self) -> dict[str, Any]:
        return {"made": self.made, "written": self.written, "duplicate": self.duplicate,
                "excluded": self.excluded, "failed": dict(sorted(self.failed.items())),
                "skipped": dict(sorted(self.skipped.items()))}  # fmt: skip


@dataclass
class BlockResult:
    """The output lines (SMILES, provenance), the rejects (line, step, SMILES, reason) and
    the counts of one block."""

    lines: list[tuple[str, str]] = field(default_factory=list)
    rejects: list[tuple[int, str, str, str]] = field(default_factory=list)
    inputs: int = 0
    originals: int = 0
    steps: dict[str, StepCounts] = field(default_factory=dict)


class Widener:
    """Widens blocks of ``(line, SMILES)`` rows with ``config``; products whose key is in
    ``excluded`` are dropped; every written SMILES uses only ``tokens``."""

    def __init__(self, config: WidenConfig, tokens: frozenset[str], excluded: frozenset[str]):
        self.config, self.tokens, self.excluded = config, tokens, excluded

    def widen_block(self, rows: list[tuple[int, str]]) -> BlockResult:
        """The originals (bad and evaluation ones rejected) and their products, in order."""
        from rdkit import RDLogger

        RDLogger.DisableLog("rdApp.*")
        result = BlockResult(steps={step: StepCounts() for step in self.config.steps})
        parsed: list[tuple[int, Any]] = []
        for line, smiles in rows:
            result.inputs += 1
            mol, reason = self._original(smiles)
            if reason is not None:
                result.rejects.append((line, "input", smiles, reason))
            else:
                parsed.append((line, mol))
        pool = FragmentPool()
        own = {}
        if "brics" in self.config.steps:
            for line, mol in parsed:
                own[line] = fragments(mol)
                for fragment in own[line]:
                    pool.add(fragment)
        for line, mol in parsed:
            self._widen_one(line, mol, own.get(line, []), pool, result)
        return result

    def _original(self, smiles: str) -> tuple[Any, str | None]:
        from rdkit import Chem

        if not smiles.isascii() and undecoded(smiles):  # bytes the reader kept undecoded
            return None, "non_utf8"
        problem = "empty" if not smiles else text_problem(smiles)
        if problem is not None:
            return None, problem
        mol = Chem.MolFromSmiles(smiles)
        if mol is None:
            return None, "invalid_smiles"
        _, again, reason = finish(mol, self.tokens)
        if reason is not None:
            return None, reason
        if evaluation_key(again) in self.excluded:
            return None, "in_evaluation_set"
        return again, None

    def _widen_one(
        self, line: int, mol: Any, own: list, pool: FragmentPool, result: BlockResult
    ) -> None:
        from rdkit import Chem

        original = Chem.MolToSmiles(mol)
        result.lines.append((original, str(line)))
        result.originals += 1
        seen, sources = {original}, [mol]
        for step in self.config.steps:
            rng = step_rng(self.config.seed, line, step)
            if self.config.fraction < 1.0 and rng.random() >= self.config.fraction:
                result.steps[step].skipped["not_drawn"] += 1
                continue
            # a salt is finished: only one-component molecules go on to other steps
            whole = [m for m in sources if step == "salts" or len(Chem.GetMolFrags(m)) == 1]
            source = sources[0] if step == "brics" else rng.choice(whole)
            made = self._run_step(step, source, own, pool, rng)
            counts = result.steps[step]
            counts.failed.update(made.failures)
            if made.skipped:
                counts.skipped[made.skipped] += 1
            for product in made.products:
                counts.made += 1
                smiles, parsed, reason = self._check(product, seen)
                if reason == "duplicate":
                    counts.duplicate += 1
                elif reason == "excluded":
                    counts.excluded += 1
                    result.rejects.append((line, step, smiles or "", "in_evaluation_set"))
                elif reason is not None:
                    counts.failed[reason] += 1
                    result.rejects.append((line, step, _loose_smiles(product), reason))
                else:
                    counts.written += 1
                    seen.add(smiles)
                    sources.append(parsed)
                    result.lines.append((smiles, f"{line}.{step}"))

    def _run_step(self, step: str, mol: Any, own: list, pool: FragmentPool, rng) -> StepResult:
        n, c = self.config.per_molecule, self.config
        if step == "brics":
            return brics_step(own, pool, rng, n, min_heavy=c.min_heavy,
                              max_heavy=c.max_heavy, max_joins=c.max_joins)  # fmt: skip
        if step == "protonate":
            return protonate_step(mol, rng, n, c.ph)
        if step == "salts":
            return salt_step(mol, rng, n, c.ph)
        if step == "tautomers":
            return tautomer_step(mol, rng, n)
        if step == "stereo":
            return stereo_step(mol, rng, n)
        return element_step(mol, rng, n)

    def _check(self, product: Any, seen: set[str]) -> tuple[str | None, Any, str | None]:
        """``(SMILES, Mol, None)`` of a product to write, else ``(SMILES or None, None,
        reason)``."""
        smiles, parsed, reason = finish(product, self.tokens)
        if reason is not None:
            return None, None, reason
        if smiles in seen:
            return smiles, None, "duplicate"
        key = evaluation_key(parsed)
        if key is None:
            return smiles, None, "no_inchi_key"
        if key in self.excluded:
            return smiles, None, "excluded"
        return smiles, parsed, None


def _loose_smiles(mol: Any) -> str:
    """A SMILES of an unsanitisable molecule, for the rejects file ("" when none)."""
    from rdkit import Chem

    try:
        return Chem.MolToSmiles(mol, canonical=False)
    except Exception:  # RDKit cannot always write what it could not sanitise
        return ""
