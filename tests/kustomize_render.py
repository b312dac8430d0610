"""A minimal kustomize renderer, for the features holdwarden's kustomizations use.

The repository has no kustomize binary, and building one from the Go module proxy costs
minutes on two cores for what the tests need: ``resources`` (files and folders),
``components``, ``patches`` (JSON 6902 with a ``target`` of kind and name, or a strategic
merge patch matched by kind, name and namespace, ``$patch: delete`` included), ``labels``
(``pairs`` with ``includeSelectors: false``) and ``images`` (``newName``/``newTag``).
Anything else in a kustomization is an error, so a kustomization that starts using a
feature this does not know fails loudly instead of rendering something kustomize would not.

Strategic merge here: maps merge key by key; a list whose items all have a ``name`` merges
item by item on it (containers, volumes, volumeMounts, ports); any other list is replaced.
That is what kustomize does for the fields these manifests patch.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

_KNOWN_KEYS = {
    "Kustomization": {"apiVersion", "kind", "resources", "components", "patches", "labels",
                      "images"},
    "Component": {"apiVersion", "kind", "resources", "components", "patches", "labels",
                  "images"},
}  # fmt: skip


class UnsupportedKustomization(ValueError):
    """The kustomization uses a feature this renderer does not implement."""


def render(folder: Path, components: list[Path] | None = None) -> list[Obj]:
    """The objects ``kustomize build folder`` prints, with ``components`` added to it (as
    if they were listed in its kustomization, after its own)."""
    return _build(folder, extra_components=list(components or []))


def _load_docs(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _kustomization(folder: Path) -> Obj:
    data: Obj = yaml.safe_load((folder / "kustomization.yaml").read_text())
    kind = data.get("kind", "Kustomization")
    unknown = set(data) - _KNOWN_KEYS.get(kind, set())
    if kind not in _KNOWN_KEYS or unknown:
        raise UnsupportedKustomization(f"{folder}: kind {kind}, fields {sorted(unknown)}")
    return data


def _build(folder: Path, extra_components: list[Path]) -> list[Obj]:
    data = _kustomization(folder)
    if data.get("kind") == "Component":
        raise UnsupportedKustomization(f"{folder} is a Component: add it to a Kustomization")
    objects: list[Obj] = []
    for entry in data.get("resources", []):
        objects.extend(_resource(folder / entry))
    for entry in data.get("components", []):
        objects = _apply(folder / entry, objects)
    for component in extra_components:
        objects = _apply(component, objects)
    return _transform(folder, data, objects)


def _resource(path: Path) -> list[Obj]:
    if path.is_dir():
        return _build(path, [])
    return _load_docs(path)


def _apply(component: Path, objects: list[Obj]) -> list[Obj]:
    """A Component acts on what has been built so far: its resources are added, then its
    own components, then its patches and transformers run over everything."""
    data = _kustomization(component)
    if data.get("kind") != "Component":
        raise UnsupportedKustomization(f"{component} is not a Component")
    objects = [*objects]
    for entry in data.get("resources", []):
        objects.extend(_resource(component / entry))
    for entry in data.get("components", []):
        objects = _apply(component / entry, objects)
    return _transform(component, data, objects)


def _transform(folder: Path, data: Obj, objects: list[Obj]) -> list[Obj]:
    objects = copy.deepcopy(objects)
    for patch in data.get("patches", []):
        objects = _patch(folder, patch, objects)
    for label in data.get("labels", []):
        if set(label) - {"pairs", "includeSelectors"} or label.get("includeSelectors", False):
            raise UnsupportedKustomization(f"{folder}: labels entry {label}")
        for obj in objects:
            obj.setdefault("metadata", {}).setdefault("labels", {}).update(label["pairs"])
    for image in data.get("images", []):
        if set(image) - {"name", "newName", "newTag"}:
            raise UnsupportedKustomization(f"{folder}: images entry {image}")
        for obj in objects:
            _set_image(obj, image)
    return objects


def _set_image(obj: Obj, image: Obj) -> None:
    pod = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in [*pod.get("containers", []), *pod.get("initContainers", [])]:
        ref: str = container.get("image", "")
        name, _, tag = ref.partition(":")
        if name != image["name"]:
            continue
        new = image.get("newName", name)
        new_tag = image.get("newTag", tag)
        container["image"] = f"{new}:{new_tag}" if new_tag else new


def _patch(folder: Path, patch: Obj, objects: list[Obj]) -> list[Obj]:
    if set(patch) - {"path", "patch", "target"}:
        raise UnsupportedKustomization(f"{folder}: patch fields {sorted(patch)}")
    text = (folder / patch["path"]).read_text() if "path" in patch else patch["patch"]
    body = yaml.safe_load(text)
    target = patch.get("target")
    if isinstance(body, list):  # JSON 6902
        if not target or set(target) - {"kind", "name"}:
            raise UnsupportedKustomization(f"{folder}: JSON 6902 patch target {target}")
        hits = [o for o in objects if _matches(o, target)]
        if not hits:
            raise UnsupportedKustomization(f"{folder}: patch target {target} matches nothing")
        for obj in hits:
            for op in body:
                _json6902(obj, op)
        return objects
    if target is not None:
        raise UnsupportedKustomization(f"{folder}: strategic merge patch with a target")
    want = {
        "kind": body["kind"],
        "name": body["metadata"]["name"],
        "namespace": body["metadata"].get("namespace"),
    }
    hits = [o for o in objects if _matches(o, want)]
    if len(hits) != 1:
        raise UnsupportedKustomization(f"{folder}: strategic merge patch matches {len(hits)}")
    if body.get("$patch") == "delete":
        return [o for o in objects if o is not hits[0]]
    _merge(hits[0], body)
    return objects


def _matches(obj: Obj, target: Obj) -> bool:
    meta = obj.get("metadata", {})
    return (
        obj.get("kind") == target["kind"]
        and meta.get("name") == target["name"]
        and (target.get("namespace") is None or meta.get("namespace") == target["namespace"])
    )


def _merge(into: Obj, patch: Obj) -> None:
    for key, value in patch.items():
        if key == "$patch":
            raise UnsupportedKustomization(f"$patch: {value} inside an object")
        old = into.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            _merge(old, value)
        elif isinstance(old, list) and isinstance(value, list) and _named(old) and _named(value):
            by_name = {item["name"]: item for item in old}
            for item in value:
                if item["name"] in by_name:
                    _merge(by_name[item["name"]], item)
                else:
                    old.append(copy.deepcopy(item))
        else:
            into[key] = copy.deepcopy(value)


def _named(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(i, dict) and "name" in i for i in items)


def _json6902(obj: Obj, op: Obj) -> None:
    """add, replace and remove (RFC 6902) on a JSON pointer path."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    parent: Any = obj
    for part in parts[:-1]:
        parent = parent[int(part)] if isinstance(parent, list) else parent[part]
    last = parts[-1]
    kind = op["op"]
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if kind == "add":
            parent.insert(index, copy.deepcopy(op["value"]))
        elif kind == "replace":
            parent[index] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del parent[index]
        else:
            raise UnsupportedKustomization(f"JSON 6902 op {kind}")
        return
    if kind in ("add", "replace"):
        if kind == "replace" and last not in parent:
            raise UnsupportedKustomization(f"replace of a missing {op['path']}")
        parent[last] = copy.deepcopy(op["value"])
    elif kind == "remove":
        del parent[last]
    else:
        raise UnsupportedKustomization(f"JSON 6902 op {kind}")
