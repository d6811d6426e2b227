// Apache Iceberg's own REST catalog server on 127.0.0.1: iceberg-core's RESTCatalogAdapter behind its
// RESTCatalogServlet (the classes the apache/iceberg-rest-fixture image serves), on Jetty, over a JDBC catalog on
// SQLite whose metadata files go to a local warehouse through Hadoop's local file system. The fixture's own main
// (RESTCatalogServer) listens on every interface; this one binds the address it is given.
//
// Run by sluice.cli.iceberg_rest with `java -cp <the iceberg-rest jars> IcebergRestServer.java HOST PORT WAREHOUSE
// DATABASE` (Java's source-file mode: nothing to build). It prints "listening <port>" once it accepts connections.
import java.util.HashMap;
import java.util.Map;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.CatalogProperties;
import org.apache.iceberg.CatalogUtil;
import org.apache.iceberg.catalog.Catalog;
import org.apache.iceberg.rest.RESTCatalogAdapter;
import org.apache.iceberg.rest.RESTCatalogServlet;
import org.eclipse.jetty.ee10.servlet.ServletContextHandler;
import org.eclipse.jetty.ee10.servlet.ServletHolder;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;

public class IcebergRestServer {
  public static void main(String[] args) throws Exception {
    if (args.length != 4) {
      System.err.println("usage: IcebergRestServer HOST PORT WAREHOUSE DATABASE");
      System.exit(2);
    }
    Map<String, String> properties = new HashMap<>();
    properties.put(CatalogProperties.CATALOG_IMPL, "org.apache.iceberg.jdbc.JdbcCatalog");
    properties.put(CatalogProperties.URI, "jdbc:sqlite:" + args[3]);
    properties.put(CatalogProperties.WAREHOUSE_LOCATION, args[2]);
    properties.put("jdbc.schema-version", "V1");
    Catalog catalog = CatalogUtil.buildIcebergCatalog("sluice_rest", properties, new Configuration());

    ServletContextHandler context = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    context.addServlet(new ServletHolder(new RESTCatalogServlet(new RESTCatalogAdapter(catalog))), "/*");
    Server server = new Server();
    ServerConnector connector = new ServerConnector(server);
    connector.setHost(args[0]);
    connector.setPort(Integer.parseInt(args[1]));
    server.addConnector(connector);
    server.setHandler(context);
    server.start();
    System.out.println("listening " + connector.getLocalPort());
    System.out.flush();
    server.join();
  }
}
