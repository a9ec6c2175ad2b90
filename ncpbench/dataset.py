"""Where specs come from: one file, our environments/ folder, or a published-layout folder.

Our folder:       index.yaml (`environments: [slug, ...]`) + <slug>.yaml
Published folder: index.yaml (`specs: [movie00, ...]`) + specs/<id>.yaml
The bundled environments ship inside the wheel as the `ncpbench.environments` package data.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

from ncpbench.spec import Spec
from ncpbench.validation import Finding, SpecError, errors, read_spec_data, validate_file


def bundled_dir() -> Path:
    """The environments folder of the installed package (or the checkout, in editable mode)."""
    return Path(str(resources.files("ncpbench.environments")))


@dataclass
class Dataset:
    root: Path
    specs: dict[str, Spec] = field(default_factory=dict)
    """Keyed by slug (ours) or published id, in index order."""
    findings: list[Finding] = field(default_factory=list)

    def __getitem__(self, key: str) -> Spec:
        try:
            return self.specs[key]
        except KeyError:
            raise KeyError(f"no environment {key!r} in {self.root}; try `ncpbench list`") from None

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.specs.values())

    def __len__(self) -> int:
        return len(self.specs)

    def digest(self) -> str:
        """A hash of every spec's content, recorded with runs so results name their dataset."""
        h = hashlib.sha256()
        for key, spec in self.specs.items():
            h.update(key.encode())
            h.update(spec.model_dump_json(by_alias=True).encode())
        return h.hexdigest()[:16]


def index_entries(root: Path) -> tuple[list[Path], list[Finding]]:
    """The spec files a folder's index lists, in order."""
    index = root / "index.yaml"
    if not index.exists():
        files = sorted(p for p in root.glob("*.yaml") if p.name != "index.yaml")
        if not files and (root / "specs").is_dir():
            files = sorted((root / "specs").glob("*.yaml"))
        return files, []
    data, findings = read_spec_data(index)
    if data is None:
        return [], findings
    if isinstance(data.get("specs"), list):
        return [root / "specs" / f"{name!s}.yaml" for name in data["specs"]], []
    if isinstance(data.get("environments"), list):
        return [root / f"{name!s}.yaml" for name in data["environments"]], []
    return [], [Finding(str(index), "-", "environments", "index.yaml must list `environments:` or `specs:`")]


def load_folder(root: Path, strict: bool = False) -> Dataset:
    """Load every spec the folder's index lists; bad files become findings (or raise, if strict)."""
    files, findings = index_entries(root)
    ds = Dataset(root=root, findings=list(findings))
    for path in files:
        if not path.exists():
            ds.findings.append(Finding(str(path), path.stem, "-", "listed in index.yaml but missing"))
            continue
        spec, found = validate_file(path)
        ds.findings.extend(found)
        if spec is not None:
            if spec.key in ds.specs:
                ds.findings.append(Finding(str(path), spec.key, "meta.id", "duplicate environment id"))
            else:
                ds.specs[spec.key] = spec
    if strict and errors(ds.findings):
        raise SpecError(ds.findings)
    return ds


def load_file(path: Path) -> Spec:
    spec, findings = validate_file(path)
    if spec is None:
        raise SpecError(findings)
    return spec


def load(path: str | Path | None = None) -> Dataset:
    """A file, a folder, or (None) the bundled environments."""
    if path is None:
        return bundled()
    p = Path(path)
    if p.is_file():
        spec = load_file(p)
        return Dataset(root=p.parent, specs={spec.key: spec})
    return load_folder(p)


@cache
def bundled() -> Dataset:
    return load_folder(bundled_dir())


def get_spec(key: str, dataset: str | Path | None = None) -> Spec:
    return load(dataset)[key]
