package qgate;

import org.apache.activemq.artemis.api.core.RoutingType;
import org.apache.activemq.artemis.core.config.Configuration;
import org.apache.activemq.artemis.core.config.impl.ConfigurationImpl;
import org.apache.activemq.artemis.core.server.embedded.EmbeddedActiveMQ;
import org.apache.activemq.artemis.core.settings.impl.AddressSettings;

/**
 * Artemis with one AMQP acceptor on 127.0.0.1:PORT, no security; queues are created on first use
 * as anycast (point-to-point, like qgate's broker). Without DATA_DIR nothing persists; with it,
 * durable messages are journalled there (fsynced before they are accepted) and survive a kill.
 * Prints "READY PORT".
 */
public final class EmbeddedArtemis {
    public static void main(String[] args) throws Exception {
        if (args.length < 1 || args.length > 2) {
            System.err.println("usage: EmbeddedArtemis PORT [DATA_DIR]");
            System.exit(2);
        }
        int port = Integer.parseInt(args[0]);
        Configuration c = new ConfigurationImpl();
        if (args.length == 2) {
            String d = args[1];
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
        c.addAddressSetting("#", new AddressSettings()
                .setDefaultAddressRoutingType(RoutingType.ANYCAST)
                .setDefaultQueueRoutingType(RoutingType.ANYCAST)
                .setAutoCreateAddresses(true)
                .setAutoCreateQueues(true));
        EmbeddedActiveMQ server = new EmbeddedActiveMQ();
        server.setConfiguration(c);
        server.start();
        System.out.println("READY " + port);
        System.out.flush();
        Thread.currentThread().join();
    }
}
