// The production tier's Temporal server: go.temporal.io/server as its own command runs it
// (the same flags the tier uses: --config-file, --allow-no-auth, start --service ...), with
// one addition: where the configuration names an authorizer, calls that poll task queues or
// answer their tasks need a token with the worker role besides what that authorizer asks.
// The server's default authorizer lets any token with write access poll, so an operator's
// token could take the worker's tasks; docs/security.md ("Who may poll") says why this
// matters and how to run the same check on a self-hosted server.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"go.temporal.io/server/common/api"
	"go.temporal.io/server/common/authorization"
	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/log"
	"go.temporal.io/server/temporal"
)

// workerAPIs are the calls a worker makes for its task queues: taking tasks, answering them,
// heartbeats. A client's own calls (start, signal, update, query, describe, and polling an
// update's outcome) are not among them.
var workerAPIs = map[string]bool{
	"PollWorkflowTaskQueue":            true,
	"PollActivityTaskQueue":            true,
	"PollNexusTaskQueue":               true,
	"RespondWorkflowTaskCompleted":     true,
	"RespondWorkflowTaskFailed":        true,
	"RespondQueryTaskCompleted":        true,
	"RespondActivityTaskCompleted":     true,
	"RespondActivityTaskCompletedById": true,
	"RespondActivityTaskFailed":        true,
	"RespondActivityTaskFailedById":    true,
	"RespondActivityTaskCanceled":      true,
	"RespondActivityTaskCanceledById":  true,
	"RecordActivityTaskHeartbeat":      true,
	"RecordActivityTaskHeartbeatById":  true,
	"RespondNexusTaskCompleted":        true,
	"RespondNexusTaskFailed":           true,
	"ShutdownWorker":                   true,
	"RecordWorkerHeartbeat":            true,
}

// workerTasks refuses the worker APIs to a caller whose role on the namespace (or the
// system) lacks the worker bit, then asks the configured authorizer.
type workerTasks struct{ next authorization.Authorizer }

func (a workerTasks) Authorize(ctx context.Context, claims *authorization.Claims,
	target *authorization.CallTarget) (authorization.Result, error) {
	if claims != nil && workerAPIs[api.MethodName(target.APIName)] {
		role := claims.System | claims.Namespaces[target.Namespace]
		if role&authorization.RoleWorker == 0 {
			return authorization.Result{
				Decision: authorization.DecisionDeny,
				Reason:   "only a token with the worker role takes and answers tasks",
			}, nil
		}
	}
	return a.next.Authorize(ctx, claims, target)
}

type services []string

func (s *services) String() string     { return strings.Join(*s, ",") }
func (s *services) Set(v string) error { *s = append(*s, v); return nil }

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func main() {
	top := flag.NewFlagSet("temporal-server", flag.ExitOnError)
	configFile := top.String("config-file", "", "the server's configuration file")
	allowNoAuth := top.Bool("allow-no-auth", false, "run without an authorizer")
	_ = top.Parse(os.Args[1:])
	if top.NArg() == 0 || top.Arg(0) != "start" {
		fail("usage: temporal-server --config-file FILE [--allow-no-auth] start --service NAME ...")
	}
	start := flag.NewFlagSet("start", flag.ExitOnError)
	var names services
	start.Var(&names, "service", "a service to run (repeat)")
	_ = start.Parse(top.Args()[1:])
	if len(names) == 0 {
		names = temporal.DefaultServices
	}

	cfg, err := config.Load(config.WithConfigFile(*configFile))
	if err != nil {
		fail("unable to load configuration: %v", err)
	}
	logger := log.NewZapLogger(log.BuildZapLogger(cfg.Log))
	authorizer, err := authorization.GetAuthorizerFromConfig(&cfg.Global.Authorization)
	if err != nil {
		fail("unable to instantiate authorizer: %v", err)
	}
	if authorization.IsNoopAuthorizer(authorizer) {
		if !*allowNoAuth {
			logger.Warn("no authorizer configured and --allow-no-auth not given")
		}
	} else {
		authorizer = workerTasks{next: authorizer}
	}
	claimMapper, err := authorization.GetClaimMapperFromConfig(&cfg.Global.Authorization, logger)
	if err != nil {
		fail("unable to instantiate claim mapper: %v", err)
	}
	audienceMapper, err := authorization.GetAudienceMapperFromConfig(&cfg.Global.Authorization)
	if err != nil {
		fail("unable to instantiate audience mapper: %v", err)
	}
	server, err := temporal.NewServer(
		temporal.ForServices(names),
		temporal.WithConfig(cfg),
		temporal.WithLogger(logger),
		temporal.InterruptOn(temporal.InterruptCh()),
		temporal.WithAuthorizer(authorizer),
		temporal.WithClaimMapper(func(*config.Config) authorization.ClaimMapper { return claimMapper }),
		temporal.WithAudienceGetter(func(*config.Config) authorization.JWTAudienceMapper {
			return audienceMapper
		}),
	)
	if err != nil {
		fail("unable to create server: %v", err)
	}
	if err := server.Start(); err != nil {
		fail("unable to start server: %v", err)
	}
}
