"""FSx for Lustre on moto's server the way AWS has it, created directly or by CloudFormation
(``AWS::FSx::FileSystem``), as ParallelCluster reads an existing file system (moto 5.2.5; file:line are of that
release). Applied by :func:`tests.support.moto_cfn_server.apply_fixes` in the server process only, through
:func:`fix_fsx`; :data:`FSX_CREATE_ONLY` and :func:`update_file_system` are the FSx entry of
``moto_cfn_properties.UPDATES``.

What moto's FSx (fsx/models.py) lacks, and what it gets here:

* ids: ``fs-`` + 8 hex (models.py:52); AWS: ``fs-`` + 17 hex ("The system-generated, unique 17-digit ID of the file
  system", https://docs.aws.amazon.com/fsx/latest/APIReference/API_FileSystem.html), which ParallelCluster's schema
  requires for ``FsxLustreSettings/FileSystemId`` (pcluster/schemas/cluster_schema.py:429 ``^fs-[0-9a-z]{17}$``).
* DescribeFileSystems answers: Lifecycle (``AVAILABLE`` at once: moto has no time), OwnerId, CreationTime, VpcId,
  NetworkInterfaceIds, FileSystemTypeVersion, StorageType (default SSD), and LustreConfiguration with DeploymentType
  (default SCRATCH_1), MountName ("fsx" for SCRATCH_1, else 8 characters unique in the region: the service model's
  LustreFileSystemConfiguration.MountName) and DataCompressionType (default NONE); DescribeFileSystems of an id
  that does not exist is FileSystemNotFound (moto: an empty list, models.py:183).
* network interfaces: AWS makes the file system's elastic network interfaces in its subnet with its security groups
  (FileSystem.NetworkInterfaceIds: "automatically created in the same VPC"; for Lustre there can be more than one);
  here one real moto ENI per subnet (requester-managed, in-use), deleted with the file system. CreateFileSystem refuses a
  subnet or security group that does not exist or is in another VPC (InvalidNetworkSettings); moto would invent the
  security group (ec2/models/elastic_network_interfaces.py:149).
* EC2 (moto: ``delete_subnet``, subnets.py:630, and ``delete_security_group``, security_groups.py:724, check nothing):
  a subnet or security group that a file system's interfaces use cannot be deleted (DependencyViolation, as EC2
  answers for any network interface; only the file systems' interfaces are checked here, because moto keeps the
  interface of a deleted NAT gateway, ec2/models/nat_gateways.py:31, which AWS releases).
* CloudFormation (moto has no model): ``AWS::FSx::FileSystem`` -- Ref the id; GetAtt LustreMountName, DNSName,
  ResourceARN (RootVolumeId: OpenZFS only); tags of the template plus aws:cloudformation:stack-name / stack-id /
  logical-id; updates per :data:`FSX_CREATE_ONLY` (replacement) and :func:`update_file_system` (in place); delete
  deletes the file system (a ``Retain`` one is kept by moto_cfn_server.fix_delete).
"""

from __future__ import annotations

import time
from typing import Any

from moto.cloudformation import parsing as P
from moto.cloudformation.exceptions import UnformattedGetAttTemplateException
from moto.core.common_models import CloudFormationModel
from moto.core.exceptions import JsonRESTError
from moto.ec2.exceptions import DependencyViolationError
from moto.ec2.models import EC2Backend, ec2_backends
from moto.ec2.utils import random_id
from moto.fsx.exceptions import FileSystemNotFound
from moto.fsx.models import FileSystem, FSxBackend, fsx_backends
from moto.moto_api._internal import mock_random

#: Changes that replace an AWS::FSx::FileSystem. Top level: the createOnlyProperties of CloudFormation's resource
#: schema (cfnlint/data/schemas/resources/eac496c3918e66ed.json, AWS::FSx::FileSystem). LustreConfiguration: what
#: CreateFileSystemLustreConfiguration has and UpdateFileSystemLustreConfiguration lacks (FSx cannot change it on a
#: file system: botocore/data/fsx/2018-03-01/service-2.json), as the CloudFormation reference has it ("Update
#: requires: Replacement" for DeploymentType, DriveCacheType, ExportPath, ImportPath, ImportedFileChunkSize,
#: CopyTagsToBackups:
#: https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-properties-fsx-filesystem-lustreconfiguration.html).
FSX_CREATE_ONLY = ("FileSystemType", "SubnetIds", "SecurityGroupIds", "KmsKeyId", "BackupId",
                   *(f"LustreConfiguration.{k}" for k in ("DeploymentType", "DriveCacheType", "ExportPath", "ImportPath",
                                                          "ImportedFileChunkSize", "CopyTagsToBackups", "EfaEnabled")))
#: LustreConfiguration keys FSx updates in place (UpdateFileSystemLustreConfiguration, same service model).
LUSTRE_UPDATABLE = ("WeeklyMaintenanceStartTime", "DailyAutomaticBackupStartTime", "AutomaticBackupRetentionDays",
                    "AutoImportPolicy", "DataCompressionType", "LogConfiguration", "RootSquashConfiguration",
                    "PerUnitStorageThroughput", "MetadataConfiguration", "ThroughputCapacity", "DataReadCacheConfiguration")


class BadRequest(JsonRESTError):
    def __init__(self, message: str):
        super().__init__("BadRequest", message)


class InvalidNetworkSettings(JsonRESTError):
    def __init__(self, message: str):
        super().__init__("InvalidNetworkSettings", message)


def _ec2(account_id: str, region_name: str) -> Any:
    return ec2_backends[account_id][region_name]


def _fsx(account_id: str, region_name: str) -> FSxBackend:
    return fsx_backends[account_id][region_name]


def _check_network(ec2: Any, subnet_ids: list[str], group_ids: list[str]) -> list[Any]:
    """The subnets of a new file system; its subnets and security groups must exist, in one VPC."""
    if not subnet_ids:
        raise InvalidNetworkSettings("At least one subnet id is required.")
    subnets = []
    for subnet_id in subnet_ids:
        found = [s for by_zone in ec2.subnets.values() for s in by_zone.values() if s.id == subnet_id]
        if not found:
            raise InvalidNetworkSettings(f"The subnet ID '{subnet_id}' does not exist")
        subnets.append(found[0])
    vpc_id = subnets[0].vpc_id
    for group_id in group_ids:
        group = ec2.get_security_group_from_id(group_id)
        if group is None or group.vpc_id != vpc_id:
            raise InvalidNetworkSettings(f"The security group '{group_id}' does not exist in VPC '{vpc_id}'")
    return subnets


def _fsx_interfaces(ec2: Any) -> list[Any]:
    return [eni for eni in ec2.enis.values() if getattr(eni, "_ct_fsx", None)]


def fix_file_systems() -> None:
    """CreateFileSystem / DescribeFileSystems / DeleteFileSystem as AWS answers them (see the module docstring)."""
    original_create = FSxBackend.create_file_system
    original_describe = FSxBackend.describe_file_systems
    original_delete = FSxBackend.delete_file_system
    original_to_dict = FileSystem.to_dict

    def create_file_system(self: FSxBackend, **kwargs: Any) -> FileSystem:
        ec2 = _ec2(self.account_id, self.region_name)
        subnets = _check_network(ec2, kwargs.get("subnet_ids") or [], kwargs.get("security_group_ids") or [])
        lustre = dict(kwargs.get("lustre_configuration") or {}) if kwargs.get("file_system_type") == "LUSTRE" else None
        if lustre is not None:
            lustre.setdefault("DeploymentType", "SCRATCH_1")
            lustre.setdefault("DataCompressionType", "NONE")
            lustre["MountName"] = "fsx" if lustre["DeploymentType"] == "SCRATCH_1" else \
                mock_random.get_random_string(8, lower_case=True)
        fs = original_create(self, **{**kwargs, "lustre_configuration": lustre or kwargs.get("lustre_configuration"),
                                      "storage_type": kwargs.get("storage_type") or "SSD"})
        old_id, old_arn, tags = fs.file_system_id, fs.resource_arn, self.list_tags_for_resource(fs.resource_arn)
        self.file_systems.pop(old_id)
        self.tagger.delete_all_tags_for_resource(old_arn)
        fs.file_system_id = random_id("fs", 17)
        fs.dns_name = fs.dns_name.replace(old_id, fs.file_system_id)
        fs.resource_arn = old_arn.replace(old_id, fs.file_system_id)
        if tags:
            self.tagger.tag_resource(fs.resource_arn, tags)
        self.file_systems[fs.file_system_id] = fs
        fs.lifecycle, fs.owner_id, fs.creation_time = "AVAILABLE", self.account_id, time.time()
        fs.vpc_id, fs.file_system_type_version = subnets[0].vpc_id, kwargs.get("file_system_type_version")
        interfaces = [ec2.create_network_interface(subnet, None, group_ids=kwargs.get("security_group_ids") or None)
                      for subnet in subnets]
        for eni in interfaces:
            eni.requester_managed, eni.status, eni._ct_fsx = True, "in-use", fs.file_system_id
        fs.network_interface_ids = [eni.id for eni in interfaces]
        return fs

    def describe_file_systems(self: FSxBackend, file_system_ids: list[str] | None = None, **kwargs: Any) -> Any:
        for file_system_id in file_system_ids or []:
            if file_system_id not in self.file_systems:
                raise FileSystemNotFound(file_system_id)
        return original_describe(self, file_system_ids=file_system_ids, **kwargs)

    def delete_file_system(self: FSxBackend, file_system_id: str, *args: Any, **kwargs: Any) -> Any:
        fs = self.file_systems.get(file_system_id)
        answer = original_delete(self, file_system_id, *args, **kwargs)
        ec2 = _ec2(self.account_id, self.region_name)
        for eni_id in getattr(fs, "network_interface_ids", []):
            ec2.enis.pop(eni_id, None)
        self.tagger.delete_all_tags_for_resource(fs.resource_arn)
        return answer

    def to_dict(self: FileSystem) -> dict[str, Any]:
        extra = {"Lifecycle": getattr(self, "lifecycle", None), "OwnerId": getattr(self, "owner_id", None),
                 "CreationTime": getattr(self, "creation_time", None), "VpcId": getattr(self, "vpc_id", None),
                 "NetworkInterfaceIds": getattr(self, "network_interface_ids", None),
                 "FileSystemTypeVersion": getattr(self, "file_system_type_version", None)}
        return {**original_to_dict(self), **{k: v for k, v in extra.items() if v}}

    FSxBackend.create_file_system = create_file_system
    FSxBackend.describe_file_systems = describe_file_systems
    FSxBackend.delete_file_system = delete_file_system
    FileSystem.to_dict = to_dict


def fix_interface_dependencies() -> None:
    """DeleteSubnet / DeleteSecurityGroup refuse while a file system's network interface uses the subnet / group
    (EC2: DependencyViolation, https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DeleteSecurityGroup.html:
    "If you attempt to delete a security group that is associated with an instance or network interface ... the
    operation fails"; a subnet with network interfaces "has dependencies and cannot be deleted")."""
    original_subnet = EC2Backend.delete_subnet
    original_group = EC2Backend.delete_security_group

    def delete_subnet(self: Any, subnet_id: str) -> Any:
        if any(eni.subnet.id == subnet_id for eni in _fsx_interfaces(self)):
            raise DependencyViolationError(f"The subnet '{subnet_id}' has dependencies and cannot be deleted.")
        return original_subnet(self, subnet_id)

    def delete_security_group(self: Any, name: str | None = None, group_id: str | None = None) -> Any:
        group = self.get_security_group_by_name_or_id(group_id or name)
        if group is not None and any(group.id in {g.id for g in eni._group_set} for eni in _fsx_interfaces(self)):
            raise DependencyViolationError(f"resource {group.id} has a dependent object")
        return original_group(self, name=name, group_id=group_id)

    EC2Backend.delete_subnet = delete_subnet
    EC2Backend.delete_security_group = delete_security_group


def update_file_system(resource: Any, props: dict[str, Any], account_id: str, region_name: str) -> None:
    """The in-place update of an AWS::FSx::FileSystem (moto_cfn_properties.UPDATES): StorageCapacity, the updatable
    LustreConfiguration keys, StorageType, FileSystemTypeVersion and Tags. StorageCapacity only grows, and for SSD
    SCRATCH_2 / PERSISTENT_* in multiples of 2400 GiB; SCRATCH_1 cannot grow (UpdateFileSystemRequest.StorageCapacity,
    botocore/data/fsx/2018-03-01/service-2.json): else BadRequest, and the stack update rolls back."""
    fs, backend = resource.fs, _fsx(account_id, region_name)
    capacity = props.get("StorageCapacity", fs.storage_capacity)
    if capacity != fs.storage_capacity:
        deployment = (fs.lustre_configuration or {}).get("DeploymentType")
        if deployment == "SCRATCH_1" or capacity < fs.storage_capacity or (
                fs.storage_type == "SSD" and capacity % 2400):
            raise BadRequest(f"Unable to update storage capacity of file system {fs.file_system_id} from "
                             f"{fs.storage_capacity} to {capacity} GiB: it must grow, in multiples of 2400 GiB "
                             f"(SCRATCH_1 cannot grow).")
        fs.storage_capacity = capacity
    lustre = props.get("LustreConfiguration", {})
    for key in LUSTRE_UPDATABLE if fs.lustre_configuration is not None else ():  # a removed key: FSx's default
        if key in lustre or key == "DataCompressionType":
            fs.lustre_configuration[key] = lustre.get(key, "NONE")
        else:
            fs.lustre_configuration.pop(key, None)
    fs.storage_type = props.get("StorageType", fs.storage_type)
    fs.file_system_type_version = props.get("FileSystemTypeVersion", fs.file_system_type_version)
    kept = [t for t in backend.list_tags_for_resource(fs.resource_arn) if t["Key"].startswith("aws:")]
    backend.tagger.delete_all_tags_for_resource(fs.resource_arn)
    backend.tagger.tag_resource(fs.resource_arn, [*props.get("Tags", []), *kept])


def fix_cloudformation_model() -> None:
    """``AWS::FSx::FileSystem`` for moto's CloudFormation (parsing.py:272: "No Moto CloudFormation support")
    (https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-resource-fsx-filesystem.html)."""

    class FsxFileSystem(CloudFormationModel):
        ATTRIBUTES = ("LustreMountName", "DNSName", "ResourceARN", "RootVolumeId")

        def __init__(self, fs: FileSystem):
            self.fs = fs

        @staticmethod
        def cloudformation_name_type() -> str:
            return ""

        @staticmethod
        def cloudformation_type() -> str:
            return "AWS::FSx::FileSystem"

        @classmethod
        def has_cfn_attr(cls, attr: str) -> bool:
            return attr in cls.ATTRIBUTES

        @property
        def physical_resource_id(self) -> str:
            return self.fs.file_system_id

        def get_cfn_attribute(self, attribute_name: str) -> Any:
            values = {"LustreMountName": (self.fs.lustre_configuration or {}).get("MountName"),
                      "DNSName": self.fs.dns_name, "ResourceARN": self.fs.resource_arn,
                      "RootVolumeId": (self.fs.open_zfs_configuration or {}).get("RootVolumeId")}
            if values.get(attribute_name) is None:
                raise UnformattedGetAttTemplateException()
            return values[attribute_name]

        @classmethod
        def create_from_cloudformation_json(cls, resource_name: str, cloudformation_json: Any, account_id: str,
                                            region_name: str, **kwargs: Any) -> "FsxFileSystem":
            props, stack_id = cloudformation_json["Properties"], kwargs.get("StackId", "")
            stack_tags = {"aws:cloudformation:stack-name": stack_id.split("/")[1] if "/" in stack_id else "",
                          "aws:cloudformation:stack-id": stack_id,
                          "aws:cloudformation:logical-id": kwargs.get("LogicalId", resource_name)}
            fs = _fsx(account_id, region_name).create_file_system(
                client_request_token=None, file_system_type=props["FileSystemType"],
                storage_capacity=props.get("StorageCapacity"), storage_type=props.get("StorageType"),
                subnet_ids=props.get("SubnetIds"), security_group_ids=props.get("SecurityGroupIds"),
                tags=[*props.get("Tags", []), *({"Key": k, "Value": v} for k, v in stack_tags.items())],
                kms_key_id=props.get("KmsKeyId"), windows_configuration=props.get("WindowsConfiguration"),
                lustre_configuration=props.get("LustreConfiguration"), ontap_configuration=props.get("OntapConfiguration"),
                file_system_type_version=props.get("FileSystemTypeVersion"),
                open_zfs_configuration=props.get("OpenZFSConfiguration"))
            return cls(fs)

        def delete(self, account_id: str, region_name: str) -> None:
            _fsx(account_id, region_name).delete_file_system(self.fs.file_system_id, None, None, None, None)

    assert FsxFileSystem in CloudFormationModel.__subclasses__()
    for cache in (P.get_model_list, P.get_model_map, P.get_name_type_map):
        cache.cache_clear()


def fix_fsx() -> None:
    """Apply every FSx fix to moto, in this process."""
    fix_file_systems()
    fix_interface_dependencies()
    fix_cloudformation_model()
