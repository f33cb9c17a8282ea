// Command registry is the CNCF distribution registry (the OCI registry behind Docker Hub and
// most private registries), built from github.com/distribution/distribution/v3 at the version
// pinned in ../versions.env. Upstream's cmd/registry also links the S3, Azure and GCS storage
// drivers and the pull-through proxy; the release test needs a loopback registry on a local
// folder only, so this wrapper registers the filesystem and inmemory drivers and nothing else
// (a much smaller cold build). `registry serve CONFIG` and `registry --version` work as upstream.
package main

import (
	"os"

	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
)

func main() {
	if err := registry.RootCmd.Execute(); err != nil {
		os.Exit(1)
	}
}
