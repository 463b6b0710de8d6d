package qgate;

import org.apache.activemq.artemis.api.core.RoutingType;
import org.apache.activemq.artemis.core.config.Configuration;
import org.apache.activemq.artemis.core.config.impl.ConfigurationImpl;
import org.apache.activemq.artemis.core.server.embedded.EmbeddedActiveMQ;
import org.apache.activemq.artemis.core.settings.impl.AddressSettings;

/**
 * Artemis with one AMQP acceptor on 127.0.0.1:PORT, no security; queues are created on first use
 * as anycast (point-to-point, like qgate's broker). Without --data nothing persists; with it,
 * durable messages are journalled in DIR (synced before they are accepted, Artemis's default)
 * and survive a kill. With --cluster CORE_PORT PEER_CORE_PORT it is one node of a two-node
 * cluster: a core acceptor on CORE_PORT, a static cluster connection to the peer's, messages
 * load-balanced on demand and redistributed at once to the node that has consumers.
 * Prints "READY PORT".
 *
 * Usage: EmbeddedArtemis PORT [--data DIR] [--cluster CORE_PORT PEER_CORE_PORT]
 */
public final class EmbeddedArtemis {
    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            System.err.println("usage: EmbeddedArtemis PORT [--data DIR] [--cluster CORE_PORT PEER_CORE_PORT]");
            System.exit(2);
        }
        int port = Integer.parseInt(args[0]);
        String data = null;
        int corePort = 0;
        int peerPort = 0;
        for (int i = 1; i < args.length; i++) {
            if (args[i].equals("--data") && i + 1 < args.length) {
                data = args[++i];
            } else if (args[i].equals("--cluster") && i + 2 < args.length) {
                corePort = Integer.parseInt(args[++i]);
                peerPort = Integer.parseInt(args[++i]);
            } else {
                System.err.println("unknown argument " + args[i]);
                System.exit(2);
            }
        }
        Configuration c = new ConfigurationImpl();
        if (data != null) {
            String d = data;
            c.setPersistenceEnabled(true);
            c.setJournalType(org.apache.activemq.artemis.core.server.JournalType.NIO);
            c.setJournalDirectory(d + "/journal");
            c.setBindingsDirectory(d + "/bindings");
            c.setLargeMessagesDirectory(d + "/large");
            c.setPagingDirectory(d + "/paging");
        } else {
            c.setPersistenceEnabled(false);
        }
        c.setSecurityEnabled(false);
        c.setJMXManagementEnabled(false);
        c.addAcceptorConfiguration("amqp", "tcp://127.0.0.1:" + port + "?protocols=AMQP;tcpNoDelay=true");
        AddressSettings settings = new AddressSettings()
                .setDefaultAddressRoutingType(RoutingType.ANYCAST)
                .setDefaultQueueRoutingType(RoutingType.ANYCAST)
                .setAutoCreateAddresses(true)
                .setAutoCreateQueues(true);
        if (corePort != 0) {
            c.addAcceptorConfiguration("core", "tcp://127.0.0.1:" + corePort + "?protocols=CORE");
            c.addConnectorConfiguration("self", "tcp://127.0.0.1:" + corePort);
            c.addConnectorConfiguration("peer", "tcp://127.0.0.1:" + peerPort);
            c.setClusterUser("qgate-cluster");
            c.setClusterPassword("qgate-cluster");
            c.addClusterConfiguration(new org.apache.activemq.artemis.core.config.ClusterConnectionConfiguration()
                    .setName("qgate")
                    .setAddress("")
                    .setConnectorName("self")
                    .setStaticConnectors(java.util.List.of("peer"))
                    .setMessageLoadBalancingType(
                            org.apache.activemq.artemis.core.server.cluster.impl.MessageLoadBalancingType.ON_DEMAND)
                    .setRetryInterval(200)
                    .setReconnectAttempts(-1)
                    .setMaxHops(1));
            settings.setRedistributionDelay(0);
        }
        c.addAddressSetting("#", settings);
        EmbeddedActiveMQ server = new EmbeddedActiveMQ();
        server.setConfiguration(c);
        server.start();
        System.out.println("READY " + port);
        System.out.flush();
        Thread.currentThread().join();
    }
}
