// compose-check validates Docker Compose files the way `docker compose config` does, without
// a Docker engine: compose-go (the library Docker Compose itself loads files with) parses
// each file, checks it against the Compose Specification's JSON schema, interpolates and
// normalises it. Any error exits 1 with the file and the reason.
//
//	go run ./deploy/tools/compose-check deploy/docker-compose.yml deploy/docker-compose.ksched.yml
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: compose-check FILE...")
		os.Exit(2)
	}
	failed := false
	for _, file := range os.Args[1:] {
		opts, err := cli.NewProjectOptions([]string{file},
			cli.WithName("ksched-check"),
			cli.WithWorkingDirectory(filepath.Dir(file)),
			cli.WithOsEnv,
		)
		if err == nil {
			var p interface{ ServiceNames() []string }
			p, err = cli.ProjectFromOptions(context.Background(), opts)
			if err == nil {
				fmt.Printf("%s: valid (%d services)\n", file, len(p.ServiceNames()))
				continue
			}
		}
		fmt.Fprintf(os.Stderr, "%s: %v\n", file, err)
		failed = true
	}
	if failed {
		os.Exit(1)
	}
}
