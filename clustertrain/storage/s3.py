"""S3Store: an S3 bucket prefix (AWS or any S3-compatible endpoint) through boto3.

Credentials come only from boto3's standard chain; nothing here reads, stores or prints them.
Each object carries its SHA-256 as user metadata ``sha256`` and, unless ``checksum`` is off, as S3's
own checksum (``ChecksumAlgorithm=SHA256``: full-object for single PUTs, per part for multipart).

Retries. Every request runs in botocore's ``standard`` retry mode (whatever ``AWS_RETRY_MODE`` says): it retries
connection errors (refused, reset, closed mid-transfer, timeouts), 5xx answers and throttling, with
truncated exponential backoff and full jitter (50 ms x 2^i for transient errors, 1 s x 2^i for throttling,
at most 20 s), under a per-client retry quota, so a dead endpoint under 8 parallel transfers cannot turn into a
retry storm. ``legacy`` mode retries fewer transient errors and has no quota; ``adaptive`` adds client-side
rate limiting, which only helps against throttling. Attempts per request: ``StoreConfig.max_attempts``, else
``AWS_MAX_ATTEMPTS`` or the profile's ``max_attempts``, else :data:`DEFAULT_ATTEMPTS` (5, not botocore's 3: one
multipart part of a large checkpoint failing its last attempt fails the whole upload). The time to give up is
bounded: an endpoint that refuses or resets connections fails a request within about a second of backoff
(0.75 s at most for 5 attempts); one that black-holes them within attempts x ``connect_timeout_s`` (or
``read_timeout_s`` once a response stalled) plus that backoff. The error is then one line naming the endpoint,
the bucket/key and the fix (:meth:`S3Store._errors`); a sync run again sends only what is missing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import botocore.exceptions as bx
import botocore.session
from boto3.exceptions import RetriesExceededError, S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config as BotoConfig

from clustertrain.core.errors import StorageError
from clustertrain.storage.store import (
    RESERVED_NAMES,
    IncompleteCleanup,
    MissingObjectError,
    ObjectInfo,
    StoreConfig,
    b64_of_hex,
)

META_KEY = "sha256"
_UNREACHABLE = (bx.EndpointConnectionError, bx.ConnectionClosedError, bx.ConnectTimeoutError, bx.ReadTimeoutError)
DEFAULT_ATTEMPTS = 5
"""Attempts per request when neither ``StoreConfig.max_attempts`` nor ``AWS_MAX_ATTEMPTS``/the profile set one."""
_MIB = 1 << 20


class S3Store(IncompleteCleanup):
    """Objects under ``s3://bucket/prefix/``."""

    def __init__(self, bucket: str, prefix: str, config: StoreConfig) -> None:
        self.bucket = bucket
        self.prefix = f"{prefix}/" if prefix else ""
        self.url = f"s3://{bucket}/{prefix}".rstrip("/")
        self.key_limit = 1024 - len(self.prefix.encode("utf-8"))
        self.config = config
        self._part = config.part_size_mb * _MIB
        self._threshold = max(config.multipart_threshold_mb * _MIB, self._part)
        self._transfer = TransferConfig(
            multipart_threshold=self._threshold, multipart_chunksize=self._part, max_concurrency=config.part_concurrency
        )
        boto_kwargs: dict = dict(
            max_pool_connections=64,
            connect_timeout=config.connect_timeout_s,
            read_timeout=config.read_timeout_s,
            s3={"addressing_style": config.addressing_style},
        )
        if not config.checksum:
            boto_kwargs.update(request_checksum_calculation="when_required", response_checksum_validation="when_required")
        with self._errors("connect to"):
            core = botocore.session.Session(profile=config.profile)
            self.attempts = config.max_attempts or core.get_config_variable("max_attempts") or DEFAULT_ATTEMPTS
            boto_kwargs["retries"] = {"mode": "standard", "total_max_attempts": self.attempts}
            session = boto3.session.Session(botocore_session=core, region_name=config.region)
            self._client = session.client("s3", endpoint_url=config.endpoint_url, config=BotoConfig(**boto_kwargs))
        self.endpoint = self._client.meta.endpoint_url

    def __repr__(self) -> str:
        return f"S3Store({self.url!r}, endpoint={self.endpoint!r})"

    # -- protocol ---------------------------------------------------------------------------------
    def list(self) -> dict[str, ObjectInfo]:
        found: dict[str, ObjectInfo] = {}
        with self._errors("list"):
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
            for page in pages:
                for obj in page.get("Contents", []):
                    key = obj["Key"][len(self.prefix) :]
                    if not key or key.endswith("/") or key in RESERVED_NAMES:
                        continue
                    found[key] = ObjectInfo(
                        key=key,
                        size=obj["Size"],
                        etag=obj.get("ETag"),
                        mtime_ns=int(obj["LastModified"].timestamp() * 1e9),
                    )
        return found

    def stat(self, key: str) -> ObjectInfo | None:
        with self._errors("read", key):
            try:
                head = self._client.head_object(Bucket=self.bucket, Key=self.prefix + key, ChecksumMode="ENABLED")
            except bx.ClientError as err:
                if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return None
                raise
        return ObjectInfo(
            key=key,
            size=head["ContentLength"],
            sha256=head.get("Metadata", {}).get(META_KEY),
            etag=head.get("ETag"),
            mtime_ns=int(head["LastModified"].timestamp() * 1e9),
            s3_sha256=head.get("ChecksumSHA256"),
        )

    def put(self, local_path: Path, key: str, sha256: str) -> ObjectInfo:
        size = local_path.stat().st_size
        meta = {"Metadata": {META_KEY: sha256}}
        with self._errors("upload", key):
            if size < self._threshold:  # one PUT: one request, and a full-object checksum S3 verifies
                extra = dict(meta)
                if self.config.checksum:
                    extra.update(ChecksumAlgorithm="SHA256", ChecksumSHA256=b64_of_hex(sha256))
                with open(local_path, "rb") as body:
                    resp = self._client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=body, **extra)
                return ObjectInfo(key=key, size=size, sha256=sha256, etag=resp.get("ETag"))
            extra = dict(meta, **({"ChecksumAlgorithm": "SHA256"} if self.config.checksum else {}))
            self._client.upload_file(str(local_path), self.bucket, self.prefix + key, ExtraArgs=extra, Config=self._transfer)
            head = self._client.head_object(Bucket=self.bucket, Key=self.prefix + key)
        return ObjectInfo(key=key, size=size, sha256=sha256, etag=head.get("ETag"))

    def get(self, key: str, local_path: Path) -> None:
        with self._errors("download", key):
            try:
                resp = self._client.get_object(Bucket=self.bucket, Key=self.prefix + key)
            except bx.ClientError as err:
                if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    raise MissingObjectError(f"{self.url}/{key} does not exist") from None
                raise
            body = resp["Body"]
            if resp["ContentLength"] >= self._part:  # large: parallel ranged GETs
                body.close()
                self._client.download_file(self.bucket, self.prefix + key, str(local_path), Config=self._transfer)
                return
            with open(local_path, "wb") as fh:
                for chunk in body.iter_chunks(_MIB):
                    fh.write(chunk)

    def delete(self, keys: list[str]) -> None:
        if len(keys) == 1:  # one key: DeleteObject, authorised per key (a batch is authorised per key on AWS too,
            with self._errors("delete", keys[0]):  # but S3-compatible servers such as moto check it on the bucket)
                self._client.delete_object(Bucket=self.bucket, Key=self.prefix + keys[0])
            return
        for start in range(0, len(keys), 1000):
            batch = [{"Key": self.prefix + k} for k in keys[start : start + 1000]]
            with self._errors("delete"):
                resp = self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            if resp.get("Errors"):
                err = resp["Errors"][0]
                raise StorageError(f"cannot delete s3://{self.bucket}/{err['Key']}: {err.get('Code')}: {err.get('Message')}")

    # -- optional ability -------------------------------------------------------------------------
    def clean_incomplete(self) -> int:
        """Abort multipart uploads left under our prefix by an interrupted sync; returns how many."""
        aborted = 0
        with self._errors("list uploads in"):
            pages = self._client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=self.prefix)
            for page in pages:
                for upload in page.get("Uploads", []):
                    self._client.abort_multipart_upload(
                        Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )
                    aborted += 1
        return aborted

    # -- errors -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _errors(self, action: str, key: str | None = None) -> Iterator[None]:
        """Turn boto errors a user can fix into one-line :class:`StorageError` messages."""
        where = f"{self.url}/{key}" if key else self.url
        endpoint = getattr(self, "endpoint", None) or self.config.endpoint_url or "the default AWS endpoint"
        started = time.monotonic()
        try:
            yield
        except (bx.NoCredentialsError, bx.PartialCredentialsError):
            raise StorageError(
                f"no AWS credentials found to {action} {where}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                "AWS_PROFILE (or --profile), or run where an instance role is available"
            ) from None
        except bx.ProfileNotFound:
            raise StorageError(
                f"AWS profile {self.config.profile!r} is not in ~/.aws/config or ~/.aws/credentials; fix the profile name"
            ) from None
        except _UNREACHABLE as err:
            raise self._unreachable(err, action, where, endpoint, started) from None
        except bx.ClientError as err:
            raise self._client_error(err, action, where, endpoint) from None
        except (S3UploadFailedError, RetriesExceededError) as err:
            cause = err.__context__ or err.__cause__
            if isinstance(cause, bx.ClientError):
                raise self._client_error(cause, action, where, endpoint) from None
            if isinstance(cause, _UNREACHABLE):  # a multipart transfer (s3transfer) gave up on the endpoint
                raise self._unreachable(cause, action, where, endpoint, started) from None
            if "NoSuchBucket" in str(err):
                raise StorageError(f"bucket {self.bucket!r} does not exist at {endpoint}; create it or fix the URL") from None
            text = " ".join(str(err).split())
            raise StorageError(f"cannot {action} {where}: {text}; run the same command again to resume") from None
        except bx.BotoCoreError as err:
            text = " ".join(str(err).split())
            raise StorageError(f"cannot {action} {where}: {text}") from None

    def _unreachable(self, err: Exception, action: str, where: str, endpoint: str, started: float) -> StorageError:
        """The endpoint could not be reached (after botocore's retries, see the module docstring)."""
        tried = f", up to {self.attempts} attempts" if hasattr(self, "attempts") else ""
        return StorageError(
            f"cannot reach the S3 endpoint {endpoint} to {action} {where} ({type(err).__name__}{tried} in "
            f"{time.monotonic() - started:.1f} s); check --endpoint-url / AWS_ENDPOINT_URL and the network, then run "
            "the same command again (it sends only what is missing)")

    def _client_error(self, err: bx.ClientError, action: str, where: str, endpoint: str) -> StorageError:
        error = err.response.get("Error", {})
        code = str(error.get("Code", "?"))
        if code == "NoSuchBucket":
            return StorageError(f"bucket {self.bucket!r} does not exist at {endpoint}; create it or fix the URL")
        if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"):
            return StorageError(
                f"access denied ({code}) to {action} {where} at {endpoint}; check the credentials in boto3's chain "
                "and the bucket policy"
            )
        message = " ".join(str(error.get("Message", "")).split())
        return StorageError(f"S3 refused to {action} {where}: {code}: {message}")

