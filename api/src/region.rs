//! AWS regions and the partitions they belong to. A node's AWS identity (IRSA, Pod
//! Identity, instance profile) is valid in its own partition only, and data sent to
//! another partition (a GovCloud or China region from a commercial node) leaves the
//! boundary the account was set up for: the operator refuses a config that names a
//! region of another partition than its nodes', and the agent refuses such a sink again.

use std::fmt;

/// An AWS partition, from the region name as AWS's endpoint rules define them
/// (`regionRegex` of each partition).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Partition {
    /// `aws`: us-, eu-, ap-, sa-, ca-, me-, af-, il-, mx- regions.
    Aws,
    /// `aws-cn`: cn-north-1, cn-northwest-1.
    China,
    /// `aws-us-gov`: us-gov-west-1, us-gov-east-1.
    UsGov,
    /// `aws-iso`: us-iso-….
    Iso,
    /// `aws-iso-b`: us-isob-….
    IsoB,
    /// `aws-iso-e`: eu-isoe-….
    IsoE,
    /// `aws-iso-f`: us-isof-….
    IsoF,
    /// A region name no partition claims: never the same partition as another region.
    Unknown,
}

/// Two-letter prefixes of the commercial partition's regions.
const AWS_PREFIXES: [&str; 9] = ["us", "eu", "ap", "sa", "ca", "me", "af", "il", "mx"];

impl Partition {
    /// The partition of a region name such as `us-west-2` or `us-gov-west-1`.
    pub fn of(region: &str) -> Partition {
        let mut parts = region.split('-');
        let (Some(first), Some(second)) = (parts.next(), parts.next()) else {
            return Partition::Unknown;
        };
        // Every region name ends with a number: `<prefix>-<words>-<n>`.
        let numbered =
            region.rsplit('-').next().is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !numbered || parts.next().is_none() {
            return Partition::Unknown;
        }
        match (first, second) {
            ("cn", _) => Partition::China,
            ("us", "gov") => Partition::UsGov,
            ("us", "iso") => Partition::Iso,
            ("us", "isob") => Partition::IsoB,
            ("eu", "isoe") => Partition::IsoE,
            ("us", "isof") => Partition::IsoF,
            (p, _) if AWS_PREFIXES.contains(&p) => Partition::Aws,
            _ => Partition::Unknown,
        }
    }

    /// The partition's name as in ARNs (`aws`, `aws-us-gov`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Partition::Aws => "aws",
            Partition::China => "aws-cn",
            Partition::UsGov => "aws-us-gov",
            Partition::Iso => "aws-iso",
            Partition::IsoB => "aws-iso-b",
            Partition::IsoE => "aws-iso-e",
            Partition::IsoF => "aws-iso-f",
            Partition::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether an identity of region `home` may send to region `target`: the same region,
/// or another region of the same, known partition.
pub fn same_partition(home: &str, target: &str) -> bool {
    home == target || {
        let p = Partition::of(home);
        p != Partition::Unknown && p == Partition::of(target)
    }
}

/// Characters of a region name (the schema's bound; the longest region today has 14).
pub const MAX_REGION_BYTES: usize = 32;

/// A region name as the CRD accepts it: `^[a-z]{2}(-[a-z]+)+-[0-9]+$`, at most
/// [`MAX_REGION_BYTES`] characters.
pub fn valid_region(region: &str) -> bool {
    let parts: Vec<&str> = region.split('-').collect();
    parts.len() >= 3
        && region.len() <= MAX_REGION_BYTES
        && parts[0].len() == 2
        && parts[..parts.len() - 1].iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase()))
        && parts.last().is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Node labels that carry the node's region (the current one first).
pub const REGION_LABELS: [&str; 2] = ["topology.kubernetes.io/region", "failure-domain.beta.kubernetes.io/region"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_names() {
        assert!(valid_region("us-west-2") && valid_region("ap-southeast-1") && valid_region("us-gov-west-1"));
        assert!(
            !valid_region("mars")
                && !valid_region("US-WEST-2")
                && !valid_region("us-west-")
                && !valid_region("u-west-2")
        );
    }

    #[test]
    fn regions_belong_to_their_partition() {
        for (region, partition) in [
            ("us-east-1", Partition::Aws),
            ("us-west-2", Partition::Aws),
            ("eu-central-2", Partition::Aws),
            ("ap-southeast-5", Partition::Aws),
            ("il-central-1", Partition::Aws),
            ("mx-central-1", Partition::Aws),
            ("cn-north-1", Partition::China),
            ("cn-northwest-1", Partition::China),
            ("us-gov-west-1", Partition::UsGov),
            ("us-gov-east-1", Partition::UsGov),
            ("us-iso-east-1", Partition::Iso),
            ("us-isob-east-1", Partition::IsoB),
            ("eu-isoe-west-1", Partition::IsoE),
            ("us-isof-south-1", Partition::IsoF),
        ] {
            assert_eq!(Partition::of(region), partition, "{region}");
        }
    }

    #[test]
    fn names_no_partition_claims_are_unknown() {
        for region in ["", "us", "us-east", "us-east-x", "zz-west-1", "mars-1", "US-EAST-1", "us-east-1-", "-us-east-1"]
        {
            assert_eq!(Partition::of(region), Partition::Unknown, "{region:?}");
        }
    }

    #[test]
    fn an_identity_reaches_its_own_partition_only() {
        assert!(same_partition("us-west-2", "us-east-1"));
        assert!(same_partition("us-west-2", "eu-west-1"));
        assert!(!same_partition("us-west-2", "us-gov-west-1"), "the attack's region");
        assert!(!same_partition("us-gov-west-1", "us-east-1"));
        assert!(same_partition("us-gov-west-1", "us-gov-east-1"));
        assert!(!same_partition("cn-north-1", "ap-east-1"));
        assert!(!same_partition("us-iso-east-1", "us-isob-east-1"));
        // An unknown region reaches itself only.
        assert!(same_partition("zz-west-1", "zz-west-1"));
        assert!(!same_partition("zz-west-1", "zz-east-1"));
        assert!(!same_partition("us-west-2", "zz-west-1"));
    }
}
