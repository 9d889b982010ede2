"""Start the service with its chroot jail's trees taken from an image-tree directory of the test's (as the
service image's /opt/sandlot/image-trees, built by `sandlot layers trees`): the launcher of a Service whose
runs must be served from an image tree's slots. SANDLOT_TEST_IMAGE_TREES names the directory; a tree missing
there is built (as the Dockerfile would) with SANDLOT_TEST_IMAGE_SLOTS slots when the service first asks; with
SANDLOT_TEST_IMAGE_LAYERLESS set, only a tree without a layer is (the image's layer-less tree: the service's layer is
an operator's, of which the image has no tree)."""

from __future__ import annotations

import os
import runpy
import socket
import sys

from runtimes.jail.policy import tree_files
from runtimes.jail.trees import image_trees, tree_store

IMAGE_DIR = os.environ["SANDLOT_TEST_IMAGE_TREES"]
SLOTS = int(os.environ.get("SANDLOT_TEST_IMAGE_SLOTS", "2"))

_find = image_trees.find


LAYERLESS = bool(os.environ.get("SANDLOT_TEST_IMAGE_LAYERLESS"))


def find(spec: dict, image_dir: str) -> str:
    if LAYERLESS and tree_files.LAYER_IN_TREE in spec.get("placed", {}):
        return _find(spec, IMAGE_DIR)  # the image has no tree of this layer
    image_trees.build(spec, IMAGE_DIR, SLOTS)  # the Dockerfile's `sandlot layers trees`, for this spec
    return _find(spec, IMAGE_DIR)


image_trees.find = find
defaults = list(tree_store.TreeStore.__init__.__defaults__)
defaults[-1] = IMAGE_DIR
tree_store.TreeStore.__init__.__defaults__ = tuple(defaults)

if __name__ == "__main__":
    if os.environ.get("SANDLOT_TEST_HOSTNAME"):  # started in a UTS namespace of its own (unshare --uts)
        socket.sethostname(os.environ["SANDLOT_TEST_HOSTNAME"])
    # argv: python -m handler.cli serve (the Service's command, after its launcher)
    sys.argv = ["handler.cli", *sys.argv[4:]]
    runpy.run_module("handler.cli", run_name="__main__", alter_sys=True)
