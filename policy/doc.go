// Package policy holds `sluice policy`: recommending NetworkPolicies from
// observed flows and proving candidate policies against them. Its
// subpackages each do one job: flowsrc reads flow records (a flow log, an
// aggregator's API), observed folds them into distinct connections,
// recommend writes policies, verify replays connections through the
// datapath model with and without candidates. This package's tests run
// them together on the demo cluster and on random clusters.
package policy
