package main

import (
	"fmt"
	"io"
	"os"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	rationv1 "github.com/ration-dev/ration/proto/ration/v1"
)

// runProtoset writes the services the agent serves (ration.v1.RateLimiter,
// Envoy's RateLimitService v3, grpc.health.v1.Health) as one protobuf
// FileDescriptorSet, with every file they import: what a generic gRPC
// load tool needs to call them (ghz --protoset), since the agent serves
// no reflection and Envoy's .proto files are not in its Go module.
func runProtoset(args []string, stdout, stderr io.Writer) error {
	if len(args) != 1 || args[0] == "" || args[0][0] == '-' {
		fmt.Fprintln(stderr, "usage: ration-bench protoset FILE   (a FileDescriptorSet for ghz --protoset)")
		return errUsage
	}
	b, err := proto.Marshal(protoset())
	if err != nil {
		return fmt.Errorf("protoset: %w", err)
	}
	if err := os.WriteFile(args[0], b, 0o644); err != nil {
		return fmt.Errorf("protoset: %w", err)
	}
	fmt.Fprintf(stdout, "wrote %s\n", args[0])
	return nil
}

// protoset is the FileDescriptorSet of the agent's services, each file
// after the files it imports.
func protoset() *descriptorpb.FileDescriptorSet {
	set := &descriptorpb.FileDescriptorSet{}
	seen := map[string]bool{}
	var add func(fd protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		imports := fd.Imports()
		for i := range imports.Len() {
			add(imports.Get(i).FileDescriptor)
		}
		set.File = append(set.File, protodesc.ToFileDescriptorProto(fd))
	}
	for _, fd := range []protoreflect.FileDescriptor{
		rationv1.File_ration_v1_ratelimiter_proto,
		rlsv3.File_envoy_service_ratelimit_v3_rls_proto,
		grpc_health_v1.File_grpc_health_v1_health_proto,
	} {
		add(fd)
	}
	return set
}
