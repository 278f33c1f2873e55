"""The training image: a container recipe rendered from pinned versions, built with docker + Enroot on the
head node, and checked on a compute node through Pyxis (docs/image.md).

=================  =====================================================================================
module             what it holds
=================  =====================================================================================
``config``         the ``image:`` section of the project file (:class:`ImageConfig`)
``versions``       the pins (``versions.yaml``) and the compatibility table (``compat.yaml``), their checks
``paths``          the image's docker reference, ``.sqsh`` path and interpreter for a project
``recipe``         the Dockerfile (``templates/Dockerfile.j2``) and its build context, ``versions.json``
``build``          ``docker build`` + ``enroot import`` as printed commands, run with checks
``footprint``      the disk a build takes per place (Docker's data root, the enroot export, the ``.sqsh``)
``squashfs``       the ``.sqsh`` on-disk format: reading and verifying its superblock and listing
``check``          the one-node job that scans the image through Pyxis, compares with the pins, and proves
                   the transport with a one-rank NCCL init (``validate.transport``)
=================  =====================================================================================

This package's ``__init__`` imports nothing: ``project.py`` composes :mod:`clustertrain.image.config`
without pulling in the stages that read the project.
"""
