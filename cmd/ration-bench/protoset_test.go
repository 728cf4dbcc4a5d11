package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

// The protoset a load tool reads resolves on its own (every import is in
// it) and holds the methods the benchmarks call.
func TestProtoset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.protoset")
	if err := run(t.Context(), []string{"protoset", path}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(b, &set); err != nil {
		t.Fatal(err)
	}
	files, err := protodesc.NewFiles(&set)
	if err != nil {
		t.Fatalf("the protoset does not resolve on its own: %v", err)
	}
	for _, m := range []string{
		"ration.v1.RateLimiter.Allow",
		"envoy.service.ratelimit.v3.RateLimitService.ShouldRateLimit",
		"grpc.health.v1.Health.Check",
	} {
		d, err := files.FindDescriptorByName(protoreflect.FullName(m))
		if err != nil {
			t.Errorf("%s: %v", m, err)
		} else if _, ok := d.(protoreflect.MethodDescriptor); !ok {
			t.Errorf("%s is a %T, not a method", m, d)
		}
	}
	if err := run(t.Context(), []string{"protoset"}, io.Discard, io.Discard); !errors.Is(err, errUsage) {
		t.Errorf("protoset without a file = %v, want a usage error", err)
	}
}
