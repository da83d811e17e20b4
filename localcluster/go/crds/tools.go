//go:build tools

// Package crds keeps the CRD source modules in the module graph.
package crds

import (
	_ "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	_ "sigs.k8s.io/jobset/api/jobset/v1alpha2"
)
