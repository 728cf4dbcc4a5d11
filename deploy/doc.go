// Package deploy holds no code: its tests prove that what operators run
// (deploy/kubernetes, deploy/docker, deploy/systemd, deploy/prometheus,
// deploy/grafana and docs/runbook.md) matches the binaries built from this
// repository.
//
// The tests build gateway-agent, coordinator and coordinator-launch with the
// Dockerfile's own build commands, run them on loopback, and check:
//
//   - every Kubernetes manifest, and every kustomization rendered, decodes
//     strictly into the Kubernetes API types (unknown fields rejected);
//   - every flag and RATION_* variable in the manifests and systemd units is
//     one the binaries accept, with values they accept;
//   - every metric and label named by the dashboard and the alerts is one
//     the binaries export, and the alerts parse with Prometheus's rule
//     parser;
//   - every alert has its runbook section, and the runbook names only
//     metrics, variables and commands that exist.
//
// It is a separate module so that the root module does not depend on
// Kubernetes, Prometheus and kustomize. Run it with: cd deploy && go test ./...
package deploy
