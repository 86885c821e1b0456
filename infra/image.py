"""WorkerImage: build `worker-image/` and push it; every instance is pinned by the pushed `repo_digest`.

The tag is derived from the build context's content (never `latest`), but nothing downstream uses the tag:
slots receive `repo@sha256:...`, so a rebuilt image is a changed input and replaces the slots, and a
host never runs a stale cached image under a reused tag.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_docker as docker

from reconciler.adapters.slot_provider import directory_digest
from reconciler.domain.slots import digest_of_image_ref


@dataclass
class WorkerImageArgs:
    repository: str  # e.g. ghcr.io/org/cuzk-worker
    context: str  # absolute path of worker-image/
    platform: str = "linux/amd64"
    base_image: str | None = None
    dockerfile: str | None = None  # default: <context>/Dockerfile
    registry_server: pulumi.Input[str] | None = None
    registry_username: pulumi.Input[str] | None = None
    registry_password: pulumi.Input[str] | None = None  # a stack config secret


class WorkerImage(pulumi.ComponentResource):
    repo_digest: pulumi.Output[str]
    image_digest: pulumi.Output[str]

    def __init__(self, name: str, args: WorkerImageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("gpu-fleet:index:WorkerImage", name, None, opts)
        tag = directory_digest(args.context).removeprefix("sha256:")[:16]
        registry = None
        if args.registry_server is not None:
            registry = docker.RegistryArgs(server=args.registry_server, username=args.registry_username,
                                           password=args.registry_password)
        self.image = docker.Image(
            f"{name}-image",
            build=docker.DockerBuildArgs(
                context=args.context,
                dockerfile=args.dockerfile or f"{args.context}/Dockerfile",
                platform=args.platform,
                # The content tag doubles as the image's version label (worker reports it at register).
                args={"IMAGE_VERSION": tag, **({"BASE_IMAGE": args.base_image} if args.base_image else {})},
            ),
            image_name=f"{args.repository}:{tag}",
            registry=registry,
            skip_push=False,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.repo_digest = self.image.repo_digest
        self.image_digest = self.repo_digest.apply(digest_of_image_ref)
        self.register_outputs({"repo_digest": self.repo_digest, "image_digest": self.image_digest})
